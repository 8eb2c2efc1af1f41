"""Top-k per row on the Vector engine: k = 8 * rounds values and their indices.

Each round: `max8` gives the 8 largest remaining values (descending), `nc_find_index8` their
positions in the original row, `nc_match_replace8` knocks them out of the working copy (-inf)
for the next round.
Run: python examples/nki_topk.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

NEG = -3.0e38


@nki.jit
def topk_rows(x, k):
    rows, cols = x.shape
    rounds = k // 8
    vals_out = nl.ndarray((rows, k), dtype=nl.float32, buffer=nl.shared_hbm)
    idx_out = nl.ndarray((rows, k), dtype=nl.uint32, buffer=nl.shared_hbm)
    for i in nl.affine_range(rows // 128):
        data = nl.load(x[i * 128 : (i + 1) * 128, :])
        work = nl.copy(data)
        vals = nl.ndarray((128, k), dtype=nl.float32, buffer=nl.sbuf)
        idx = nl.ndarray((128, k), dtype=nl.uint32, buffer=nl.sbuf)
        for r in nl.sequential_range(rounds):
            v8 = vals[:, r * 8 : (r + 1) * 8]
            nisa.max8(dst=v8, src=work)
            nisa.nc_find_index8(dst=idx[:, r * 8 : (r + 1) * 8], data=data, vals=v8)
            if r + 1 < rounds:
                nisa.nc_match_replace8(dst=work, data=work, vals=v8, imm=NEG)
        nl.store(vals_out[i * 128 : (i + 1) * 128, :], vals)
        nl.store(idx_out[i * 128 : (i + 1) * 128, :], idx)
    return vals_out, idx_out


def reference(x: np.ndarray, k: int):
    order = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=1).astype(np.float32), order.astype(np.uint32)


def main() -> int:
    rng = np.random.default_rng(7)
    x = rng.permutation(128 * 1024).reshape(128, 1024).astype(np.float32)  # distinct values: no ties
    vals, idx = topk_rows(x, 16)
    ref_v, ref_i = reference(x, 16)
    ok = np.array_equal(vals, ref_v) and np.array_equal(idx, ref_i)
    print(f"top-16 of {x.shape}: {'exact' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
