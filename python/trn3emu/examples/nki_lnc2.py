"""An LNC=2 kernel: `kernel[2](...)` runs two programs, one per NeuronCore of the logical core.

Program `nl.program_id(0)` handles its half of the rows: y = relu(2 * x + bias), with the
per-row bias as a [P, 1] tile operand of ScalarE's `activation`. Both programs write one
`nl.shared_hbm` output.
Run: python examples/nki_lnc2.py
"""

import numpy as np

import trn3emu.nki

trn3emu.nki.install()

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402


@nki.jit
def scaled_relu(x, bias):
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    per_prog = rows // nl.num_programs(0)
    base = nl.program_id(0) * per_prog
    for i in nl.affine_range(per_prog // 128):
        r0 = base + i * 128
        xt = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0 : r0 + 128, :])
        nisa.dma_copy(dst=bt, src=bias[r0 : r0 + 128, :])
        yt = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=yt, op=nl.relu, data=xt, bias=bt, scale=2.0)
        nisa.dma_copy(dst=out[r0 : r0 + 128, :], src=yt)
    return out


def reference(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return np.maximum(x * np.float32(2) + bias, np.float32(0)).astype(np.float32)


def main() -> int:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    bias = rng.standard_normal((512, 1)).astype(np.float32)
    y = scaled_relu[2](x, bias)
    ok = np.array_equal(y, reference(x, bias))
    print(f"LNC=2 scaled_relu {x.shape}: {'exact' if ok else 'MISMATCH'}")
    print(scaled_relu.last_result.trace.summary())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
