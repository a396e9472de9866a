"""The daemons that hold tensors link the torch wheel's LibTorch, CUDA
build: tandem-rollout and tandem-trainer load libtorch_cuda and libc10_cuda
from the wheel of the venv that runs this script, and every process loads
exactly one CUDA runtime and one NCCL, the wheel's (docs/platform.md).
The tools and daemons that hold no tensors (tandemctl, tandem-local,
tandem-coordinator, tandem-verifier) load no LibTorch and no CUDA at all.

    .venv/bin/python check_platform.py    (TANDEM_BIN_DIR: the build's bin/)"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DAEMONS = ("tandem-rollout", "tandem-trainer")
NO_TORCH = ("tandemctl", "tandem-local", "tandem-coordinator",
            "tandem-verifier")
TORCH_OR_CUDA = ("libtorch", "libc10", "libcudart", "libnccl")
ONE_COPY = ("libcudart.so", "libnccl.so", "libtorch_cpu.so", "libc10.so")


def loaded(binary):
    """{soname: resolved path} of what ldd says `binary` loads."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True,
                         check=True).stdout
    return {m.group(1): os.path.realpath(m.group(2)) for m in
            re.finditer(r"^\s*(\S+) => (/\S+)", out, re.M)}


def check(fail, binary, torch_dir):
    libs = loaded(binary)
    name = os.path.basename(binary)
    wheel = os.path.dirname(torch_dir) + os.sep
    for want in ("libtorch_cuda.so", "libc10_cuda.so"):
        path = libs.get(want)
        fail.check(path is not None and path.startswith(torch_dir),
                   f"{name}: {want} not loaded from the wheel's "
                   f"{torch_dir}/lib (got {path})")
    for prefix in ONE_COPY:
        copies = sorted({p for soname, p in libs.items()
                         if soname.startswith(prefix)})
        fail.check(len(copies) == 1 and copies[0].startswith(wheel),
                   f"{name}: {prefix}* must be loaded once, from the venv's "
                   f"site-packages; got {copies}")
    stray = sorted(p for p in libs.values()
                   if "/usr/local/cuda" in p or "libtorch.so.1" in p)
    fail.check(not stray, f"{name}: loads libraries outside the wheel: "
               f"{stray}")
    print(f"{name}: {len(libs)} libraries; libtorch_cuda "
          f"{libs.get('libtorch_cuda.so')}")


def check_no_torch(fail, binary):
    libs = loaded(binary)
    name = os.path.basename(binary)
    heavy = sorted(s for s in libs if s.startswith(TORCH_OR_CUDA))
    fail.check(not heavy, f"{name}: must not link LibTorch or CUDA, loads "
               f"{heavy}")
    print(f"{name}: {len(libs)} libraries, no LibTorch")


def main():
    import torch  # the wheel of this venv
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    bin_dir = os.environ.get("TANDEM_BIN_DIR", "")
    fail = common.Failures()
    # Self-check: a binary that does not link LibTorch must fail the check.
    probe = common.Failures()
    check(probe, "/bin/ls", torch_dir)
    fail.check(len(probe.messages) >= 3, "self-check: /bin/ls passed the LibTorch "
               "checks")
    for daemon in DAEMONS:
        path = os.path.join(bin_dir, daemon)
        if not fail.check(os.access(path, os.X_OK), f"{path} missing"):
            continue
        check(fail, path, torch_dir)
    # Self-check: a binary that links LibTorch must fail the other check.
    probe = common.Failures()
    check_no_torch(probe, os.path.join(bin_dir, DAEMONS[0]))
    fail.check(probe.messages, "self-check: tandem-rollout passed the "
               "no-LibTorch check")
    for tool in NO_TORCH:
        path = os.path.join(bin_dir, tool)
        if fail.check(os.access(path, os.X_OK), f"{path} missing"):
            check_no_torch(fail, path)
    fail.exit("platform libraries")


if __name__ == "__main__":
    main()
