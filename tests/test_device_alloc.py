"""Issue 18: making a `Device` under a host-memory cap raises `ResourceError`, never aborts.

Each Device reserves 8 cores of SBUF and PSUM (~272 MiB of address space); creation used to
abort the process ("memory allocation of 33562624 bytes failed", rc 134) when the host could not
provide it, e.g. under an `RLIMIT_AS` cap in a fuzz run."""

import json
import subprocess
import sys
import textwrap

CASE = textwrap.dedent(
    """
    import json, resource
    import trn3emu as t3

    # Python, numpy and the extension are loaded: cap the address space ~1.5 GiB above today's.
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    cap = vm + (3 << 29)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    devs, out = [], {}
    try:
        for _ in range(64):
            devs.append(t3.Device())
    except t3.errors.ResourceError as e:
        out = {"error": type(e).__name__, "rule": e.rule, "message": str(e), "memory": isinstance(e, MemoryError)}
    out["made"] = len(devs)
    # Not poisoned: free two devices, a new one fits and runs.
    del devs[:2]
    d = t3.Device()
    t = d.hbm.put(__import__("numpy").arange(16, dtype="float32"))
    out["after"] = d.hbm.get(t).tolist()
    print(json.dumps(out))
    """
)


def test_creating_devices_until_the_cap_raises_resource_error_never_aborts():
    r = subprocess.run([sys.executable, "-c", CASE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (134/-6 is an abort): {r.stderr[-2000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] == "ResourceError" and out["rule"] == "host_allocation_failed", out
    assert out["memory"] and "host memory" in out["message"]
    assert 1 <= out["made"] < 64, out  # some fit, the cap stopped the rest
    assert out["after"] == list(range(16))
