"""Row softmax with the nl convenience ops: y = exp(x - max) / sum(exp(x - max)).

`nl.max` lowers to `tensor_reduce`, `nl.exp` to `activation(exp)`, `nl.sum` to `tensor_reduce`,
`nl.reciprocal` to `activation(reciprocal)`, `nl.multiply` by a [P, 1] tile to `tensor_scalar`.
Run: python examples/nki_softmax.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def softmax_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128 : (i + 1) * 128, :])
        m = nl.max(t, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(t, m))
        s = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[i * 128 : (i + 1) * 128, :], nl.multiply(e, nl.reciprocal(s)))
    return out


def reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(x.dtype)


def main() -> int:
    from trn3emu.testing import assert_close

    x = np.random.default_rng(3).standard_normal((256, 1024)).astype(np.float32)
    assert_close(softmax_rows(x), reference(x), rtol=1e-4, atol=1e-6)
    print(f"softmax {x.shape}: matches numpy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
