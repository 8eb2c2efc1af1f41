"""Legacy `affine_range` / `sequential_range` bodies traced once: explicit placements.

The legacy `neuronxcc` toolchain did not unroll these loops while tracing ("Using affine_range
prevents Neuron compiler from unrolling the loops until entering compiler backend"; only
`static_range` is "fully unrolled during NKI kernel tracing": the `nki.language` iterator pages of
the legacy API reference), so a loop body's Python ran once and each allocation in it made one
buffer, used by every iteration. The emulator runs the body once per iteration; for automatic
tiles that changes nothing (the allocator places them), but a kernel that computes its direct
allocation addresses with a Python counter in the body (`addr += nbytes` after each
`ncc.sbuf.mod_alloc(base_addr=addr)`, nki-samples' allocated SD attention) would ask for new
addresses every iteration and run out of SBUF. So, in the legacy dialect, an explicit placement
made in a later iteration of the outermost such loop takes the placement the same allocation
made in the loop's first iteration (the same call site, the same occurrence within the
iteration). Python state outside placements still runs per iteration."""

from __future__ import annotations


class _State:
    __slots__ = ("iteration", "counts", "first")

    def __init__(self) -> None:
        self.iteration = 0
        self.counts: dict = {}
        self.first: dict = {}


class OnceRange:
    """A legacy traced-once loop's range as the kernel sees it: iterating it keeps the trace's
    `once` state (the outermost such loop only); otherwise it behaves as the range."""

    __slots__ = ("range", "ctx")

    def __init__(self, r, ctx) -> None:
        self.range, self.ctx = r, ctx

    def __iter__(self):
        ctx = self.ctx
        iters = ctx.loop_iters  # (every such loop's iteration, outermost first: `load_reuse`)
        depth = len(iters)
        iters.append(0)
        if ctx.once is not None:  # (an inner loop: its iterations belong to the outer one's)
            try:
                for i, v in enumerate(self.range):
                    iters[depth] = i
                    yield v
            finally:
                del iters[depth:]
            return
        st = ctx.once = _State()
        try:
            for i, v in enumerate(self.range):
                st.iteration, st.counts = i, {}
                iters[depth] = i
                yield v
        finally:  # (also on break / an exception: the generator is closed)
            ctx.once = None
            del iters[depth:]

    def __len__(self) -> int:
        return len(self.range)

    def __getitem__(self, i):
        return self.range[i]

    def __reversed__(self):
        return reversed(self.range)

    def __contains__(self, v) -> bool:
        return v in self.range

    def __getattr__(self, name):
        return getattr(self.range, name)


def placement(ctx, site, buffer, address):
    """(buffer, address) for an explicit placement at `site` (the caller's code object and
    instruction offset): the first iteration's, in a later iteration of a traced-once loop."""
    st = ctx.once
    if st is None:
        return buffer, address
    n = st.counts.get(site, 0)
    st.counts[site] = n + 1
    key = (site, n)
    if st.iteration == 0:
        st.first[key] = (buffer, address)
        return buffer, address
    return st.first.get(key, (buffer, address))
