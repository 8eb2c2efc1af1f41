"""The import graph of python/trn3emu (issue 27, item 1: one layer per stage, no cycles).

Every module is parsed with ast; an edge A -> B is any import of trn3emu module B in A, at module level or inside
a function (a lazy import is still a dependency; so is an `if TYPE_CHECKING:` import, in this full graph).
Strongly connected components of size > 1 are cycles.
Both graphs are DAGs (docs/nki.md, "Module layers"). Where a lower NKI module calls back into a higher one
(NkiTensor's `a + b` is nl.add), it goes through `nki._kernel.upcalls`, which the higher modules fill when imported;
test_upcalls_are_the_public_ops checks every entry the code reads is set, and to what.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "python" / "trn3emu"

# Largest strongly connected component counting function-level imports: 26 (plus one of 3: _asm, dtypes, tensor)
# on 2026-12-06 before issue 27 item 1, 0 after. (Counting `from pkg import sub` as an import of pkg/__init__ as
# well gives 36, or 8 + 19 at module level: that is the counting, not the code.) Never raise them.
MAX_SCC_ALL = 0
MAX_SCC_MODULE_LEVEL = 0


def _module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(mod, is_pkg, node):
    """Absolute names a From/Import node refers to (relative imports resolved against mod)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from pkg import sub` names module pkg.sub when it exists (the caller walks up to pkg otherwise); the
    # package __init__ every submodule import runs first is not counted, else every package would be a cycle.
    return [f"{prefix}.{a.name}" for a in node.names]


def import_graph(module_level_only=False):
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    # Extension modules are leaves; without them `from trn3emu import _native` would count as an import of the
    # package __init__ and invent cycles. A fresh clone has no built .so in the tree (it lives in site-packages),
    # so a stub (.pyi) with no .py beside it marks an extension module too.
    stubs = [p for p in ROOT.rglob("*.pyi") if not p.with_suffix(".py").exists()]
    natives = {_module_name(p.with_name(p.name.split(".")[0] + ".py")) for p in [*ROOT.rglob("*.so"), *stubs]}
    graph = {m: set() for m in files}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = tree.body if module_level_only else ast.walk(tree)
        for node in nodes:
            if module_level_only and isinstance(node, ast.If):  # `if TYPE_CHECKING:` and friends
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _resolve(mod, path.name == "__init__.py", node):
                    # `from .x import y` names module x.y if that exists, else module x.
                    while name and name not in files and name not in natives:
                        name = name.rpartition(".")[0]
                    if name and name != mod and name not in natives:
                        graph[mod].add(name)
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm (iterative); returns the components with more than one module."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_tarjan_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(g) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_graph_sees_lazy_imports():
    g = import_graph()
    lazy = import_graph(module_level_only=True)
    assert sum(map(len, g.values())) > sum(map(len, lazy.values()))
    assert "trn3emu.errors" in g["trn3emu.nki.isa"]


@pytest.mark.parametrize("module_level_only,limit", [(False, MAX_SCC_ALL), (True, MAX_SCC_MODULE_LEVEL)])
def test_cycles_do_not_grow(module_level_only, limit):
    sccs = strongly_connected(import_graph(module_level_only))
    biggest = max(map(len, sccs), default=0)
    assert biggest <= limit, f"import cycle grew to {biggest} modules: {max(sccs, key=len)}"


def test_no_import_cycles():
    sccs = strongly_connected(import_graph())
    assert not sccs, f"import cycles: {sccs}"


def test_the_tracing_core_is_below_the_language():
    """The layer order of docs/nki.md, edge by edge: no path from a lower layer to a higher one."""
    g = import_graph()

    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for b in g[todo.pop()] - seen:
                seen.add(b)
                todo.append(b)
        return seen

    nki = "trn3emu.nki."
    assert not reach("trn3emu.dtypes") & {"trn3emu._asm", "trn3emu.tensor"}
    assert not reach("trn3emu.trace") & {"trn3emu", "trn3emu.calibration", "trn3emu.nki"}
    for low, high in [
        ("_frames", "_kernel"),
        ("_traceback", "_kernel"),
        ("_kernel", "indexing"),
        ("indexing", "isa"),
        ("registers", "isa"),
        ("load_reuse", "isa"),
        ("isa", "pending"),
        ("isa", "blocks"),
        ("pending", "language"),
        ("blocks", "language"),
        ("language", "collectives"),
        ("language", "legacy"),
    ]:
        assert nki + low in reach(nki + high), (low, high)
        assert nki + high not in reach(nki + low), (low, high)
    assert "trn3emu.nki" not in reach(nki + "legacy")


def _upcall_names():
    """Attribute names the package reads off `upcalls` (or `_upcalls`), and the names `_op` looks up on it."""
    names = set()
    for path in (ROOT / "nki").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in ("upcalls", "_upcalls") and isinstance(node.ctx, ast.Load):
                    names.add(node.attr)
            if path.name == "_kernel.py" and isinstance(node, ast.FunctionDef) and node.name.startswith("__"):
                for call in ast.walk(node):  # self._op("less", o)
                    if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "_op":
                        arg = call.args[0]  # "less", or "bitwise_and" if ... else "logical_and"
                        for c in (arg.body, arg.orelse) if isinstance(arg, ast.IfExp) else (arg,):
                            names.add(c.value)
    return names


def test_upcalls_are_the_public_ops():
    import trn3emu.nki.language as nl
    from trn3emu.nki import _kernel, blocks, indexing

    names = _upcall_names()
    assert {"add", "less", "bitwise_and", "logical_or", "ndarray", "assign", "evict_one", "index_view"} <= names
    table = vars(_kernel.upcalls)
    assert names <= set(table), f"read but never set: {sorted(names - set(table))}"
    for name, f in table.items():  # the same objects a kernel reaches through nl.* (after wrapping)
        if name in ("assign", "inplace", "loop_reduce"):
            assert f is getattr(nl, "_" + {"loop_reduce": "LoopReduce"}.get(name, name))
        elif name in ("evict_one",):
            assert f is blocks.evict_one
        elif name in ("index_types", "dyn_index"):
            assert {"index_types": (indexing.IndexExpr, indexing.DynIndex)}.get(name, f) == f
        elif name in ("has_expr", "has_tile", "ds_past_end", "index_view"):
            assert f is getattr(indexing, name)
        else:
            assert f is getattr(nl, name), name
