"""Technique verdicts taken on Numba's CUDA simulator in a process of its own: how the gpu runner
grades a kernel's technique from the same trace, counted the same way, as the cpu runner.

    outcomes = verdicts_in_simulator([Verdict(transpose_technique, transpose, {"seed": 0})])
    outcomes[0]     # None: the technique holds; else the AssertionError's message

A verdict is a module-level function of gpulab.checks, `verdict(kernel, **settings)`, that
traces the kernel (gpulab.sim) and raises AssertionError with the learner's message, or returns
None. On a GPU, numba.cuda is the real driver and cannot be switched to the simulator inside the
process, so the learner's kernel is packed (gpulab.sim.portable: its bytecode and the values it
reads) and sent to this module, run as a process of its own with the simulator on and no GPU
(`python -I`, this gpulab first on its path), which takes each verdict on the unpacked kernel
and answers one outcome per verdict. The process inherits the grading sandbox's limits: its
RLIMIT_NPROC counts the simulator's threads (one per CUDA thread of a block) with the kernel's.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import gpulab

# Under the gpu runner's 60 s per test cell (autograder/profiles.py): starting the process
# takes a few seconds, and the cpu runner traces each part's kernel in a few more.
TIMEOUT_S = 45
GPULAB_ROOT = Path(gpulab.__file__).resolve().parents[1]  # the folder that holds gpulab/
TAIL_CHARS = 1500  # of a failed process's stderr, quoted in the message
# The process: the simulator, no GPU. Isolated mode (-I) and this gpulab's folder first on its
# path: a gpulab folder in the working directory cannot stand in for the one grading.
CHILD_ENV = {"GPULAB_RUNNER": "cpu", "NUMBA_ENABLE_CUDASIM": "1", "CUDA_VISIBLE_DEVICES": ""}
BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_module(sys.argv[2], run_name='__main__', alter_sys=True)")


@dataclass(frozen=True)
class Verdict:
    """One technique verdict to take: `verdict(kernel, **settings)`."""

    verdict: object  # a module-level function of gpulab.checks
    kernel: object  # the learner's @cuda.jit kernel
    settings: dict = field(default_factory=dict)  # plain values: sizes, seeds


def verdicts_in_simulator(verdicts: list[Verdict], timeout_s: float = TIMEOUT_S) -> list:
    """Each verdict's outcome, taken in one simulator process: None where the technique holds,
    else the message of the AssertionError it raised. A kernel that cannot be packed, and a
    process that fails or runs past `timeout_s`, raise AssertionError saying so."""
    return take_request(pack_request(verdicts), timeout_s)


def pack_request(verdicts: list[Verdict]) -> bytes:
    """What the process reads: each verdict's name, its packed kernel and its settings. The
    kernels are packed here, before anything else may trace them (a trace swaps `cuda`)."""
    from gpulab.sim.portable import NotPortable, pack_kernel

    jobs = []
    for v in verdicts:
        module, name = v.verdict.__module__, v.verdict.__qualname__
        if not module.startswith("gpulab.checks."):
            raise ValueError(f"{module}.{name} is not a verdict of gpulab.checks")
        try:
            kernel = pack_kernel(v.kernel)
        except NotPortable as error:
            raise AssertionError(f"The technique is graded on the simulator's trace, in a "
                                 f"process of its own, and the kernel cannot be sent there: "
                                 f"{error}") from error
        jobs.append((module, name, kernel, dict(v.settings)))
    return pickle.dumps({"thread_stack_bytes": threading.stack_size(), "jobs": jobs})


def take_request(request: bytes, timeout_s: float = TIMEOUT_S) -> list:
    """Start the simulator process on `request` (pack_request) and read its outcomes."""
    command = [sys.executable, "-I", "-c", BOOT, str(GPULAB_ROOT), __name__]
    try:
        done = subprocess.run(command, input=request, capture_output=True,
                              env={**os.environ, **CHILD_ENV}, timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"Tracing the kernel on the simulator, in a process of its own, ran past "
            f"{timeout_s:.0f} s: look for a loop that never ends (a `while` whose index never "
            "grows, or a stride of 0).") from error
    try:
        outcomes = json.loads(done.stdout.decode())
        assert done.returncode == 0 and isinstance(outcomes, list)
    except (ValueError, AssertionError):
        stderr = done.stderr.decode(errors="replace")[-TAIL_CHARS:]
        raise AssertionError(
            f"The simulator process that traces the kernel for its technique failed (exit "
            f"status {done.returncode}):\n{stderr}") from None
    return outcomes


def _take(module: str, name: str, kernel: bytes, settings: dict):
    from gpulab.sim.portable import unpack_kernel

    verdict = getattr(importlib.import_module(module), name)
    try:
        verdict(unpack_kernel(kernel), **settings)
    except AssertionError as error:
        return str(error)
    return None


def main() -> int:
    """The process's side: read the jobs on stdin, answer the outcomes on stdout as JSON."""
    if not gpulab.runner.simulator:  # started by hand with a GPU: refuse, do not guess
        print("the simulator process needs GPULAB_RUNNER=cpu", file=sys.stderr)
        return 2
    request = pickle.loads(sys.stdin.buffer.read())
    if request["thread_stack_bytes"]:  # the grading kernel's (autograder/sandbox.py)
        threading.stack_size(request["thread_stack_bytes"])
    answer, sys.stdout = sys.stdout, sys.stderr  # a kernel's print() must not mix in
    try:
        outcomes = [_take(*job) for job in request["jobs"]]
    except Exception:  # not a verdict: the process failed; the parent quotes this
        traceback.print_exc()
        return 1
    answer.write(json.dumps(outcomes))
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
