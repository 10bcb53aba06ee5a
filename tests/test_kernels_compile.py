"""Every kernel in gpulab/kernels/ compiles with the real numba.cuda compiler, not only on the
simulator, which runs kernels as plain Python and so accepts things a GPU never would (a shared
array whose shape is not a compile-time constant, a Python list, a float64 slipping in).

Compiling to PTX needs libNVVM from a CUDA toolkit but no GPU, so this runs wherever a toolkit
is installed and skips elsewhere. It runs in a child process because the simulator or the real
compiler is chosen when numba.cuda is first imported, and this process has the simulator.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.kernels import histogram, matmul, reduce, transpose, vector_add

ROOT = Path(__file__).resolve().parent.parent
CC = (7, 5)  # the oldest GPU the course targets: Colab's T4

VEC, MAT, IDX = "float32[::1]", "float32[:, ::1]", "int32[::1]"  # C-contiguous, as launched
SIGNATURES = {  # module -> op -> the argument types of every kernel of that op
    "vector_add": {"vector_add": f"void({VEC}, {VEC}, {VEC})",
                   "saxpy": f"void({VEC}, float32, {VEC}, {VEC})"},
    "matmul": {"matmul": f"void({MAT}, {MAT}, {MAT})"},
    "reduce": {"reduce": f"void({VEC}, {VEC})"},
    "histogram": {"histogram": f"void({IDX}, {IDX})"},
    "transpose": {"transpose": f"void({MAT}, {MAT})"},
}
MODULES = {"vector_add": vector_add, "matmul": matmul, "reduce": reduce,
           "histogram": histogram, "transpose": transpose}

CHILD = r"""
import importlib, json, os, re, sys
import gpulab  # the cpu runner turns the simulator on; this child only compiles, so turn it off
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from numba.core import config
config.reload_config()
from numba import cuda
from numba.cuda.cudadrv import nvvm
args = json.loads(sys.argv[1])
cc = tuple(args["cc"])
if not nvvm.is_available():
    print(json.dumps({"skip": "libNVVM (CUDA toolkit) not found"}))
    sys.exit(0)
import numba.cuda.dispatcher as dispatcher
if not cuda.is_available():
    # Device functions (the shuffles) ask the current GPU for its compute capability; there is
    # none here, so answer for the target we compile for.
    class _Target:
        compute_capability = cc
    dispatcher.get_current_device = lambda: _Target()
results = {}
for module, kernel, sig in args["jobs"]:
    fn = getattr(importlib.import_module("gpulab.kernels." + module), kernel).py_func
    try:
        ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
        results[kernel] = "f64" if re.search(r"\.f64\b", ptx) else "ok"
    except Exception as e:
        results[kernel] = type(e).__name__ + ": " + str(e).splitlines()[0]
print(json.dumps(results))
"""


def _jobs():
    jobs = []
    for name, module in MODULES.items():
        for attr in sorted(vars(module)):
            op, sep, version = attr.partition("_kernel_v")
            if sep and version.isdigit():
                jobs.append((name, attr, SIGNATURES[name][op]))
    return jobs


def test_every_kernel_version_is_listed():
    names = [kernel for _, kernel, _ in _jobs()]
    assert len(names) == 12, names  # 2 + 2 + 3 + 2 + 3 versions
    assert "reduce_kernel_v3" in names and "transpose_kernel_v3" in names


def test_kernels_compile_for_a_real_gpu():
    args = json.dumps({"jobs": _jobs(), "cc": CC})
    proc = subprocess.run([sys.executable, "-c", CHILD, args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    problems = []
    for kernel, result in sorted(results.items()):
        if result == "f64":
            problems.append(f"{kernel}: does float64 arithmetic in a float32 kernel (a Python "
                            "float literal such as `0.0` in an expression promotes it; write "
                            "float32(0.0)); most GPUs run float64 at 1/32 to 1/64 speed")
        elif result != "ok":
            problems.append(f"{kernel}: the real CUDA compiler rejects it: {result}")
    assert not problems, "\n".join(problems)
