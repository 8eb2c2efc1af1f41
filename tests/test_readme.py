"""The README's Python example runs as written and computes what it says."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    a = scope["dev"].hbm.get(scope["a"]).astype(np.float32)
    b = scope["dev"].hbm.get(scope["b"]).astype(np.float32)
    want = np.maximum(0.5 * (a.T @ b), 0)
    np.testing.assert_allclose(scope["y"], want, rtol=1e-5, atol=1e-5)


def test_readme_opens_with_the_two_setup_commands():
    first = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1).strip().splitlines()
    assert first[0].startswith("pip install . && ") and "demo" in first[0]
    assert first[1].startswith("pip install '.[test]'") and "pytest" in first[1]
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[0] in ci and first[1] in ci
