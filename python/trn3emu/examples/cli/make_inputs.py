"""Write a.npy [128, 128] and b.npy [128, 512] (bfloat16, seeded) for prog.t3s (README, "Command line")."""

import ml_dtypes
import numpy as np

rng = np.random.default_rng(0)
np.save("a.npy", rng.random((128, 128)).astype(ml_dtypes.bfloat16))
np.save("b.npy", rng.random((128, 512)).astype(ml_dtypes.bfloat16))
print("wrote a.npy (128, 128) bfloat16, b.npy (128, 512) bfloat16")
