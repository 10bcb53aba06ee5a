"""Where the course runs: the runner (cpu or gpu), the torch device, Colab, the simulator switch.

gpulab decides once, at import, from GPULAB_RUNNER=auto|cpu|gpu (auto by default):

    gpu   an NVIDIA GPU is usable: real numba.cuda kernels, nccl, full problem sizes
    cpu   anything else: Numba's CUDA simulator, gloo, small problem sizes

Everything that differs between the two (sizes, tolerances, backend, precision recipe) is read
from the `Runner` value, never from `if` branches scattered in notebooks.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

RUNNER_CHOICES = ("auto", "cpu", "gpu")
# "1" in the grader's kernels (autograder/profiles.py): what only a learner needs (a progress()
# table, lines that show a long run moving) is left out of grading.
GRADING_VARIABLE = "GPULAB_GRADING"
STATE_DIR_VARIABLE = "GPULAB_STATE_DIR"  # where hint() records the levels seen (state_dir)
# On Linux, gloo ranks (run_on_ranks, and LocalCluster's on the cpu runner) are forked from warm
# servers that imported torch once (gpulab/distributed/runtime/forkserver.py, nodeserver.py).
# "1" (or "true", "yes") starts every rank in a fresh interpreter instead: read by fresh_ranks().
FRESH_RANKS_VARIABLE = "GPULAB_FRESH_RANKS"
# The variables a warm rank server does not inherit: they name a moment, not a setting, and
# nothing a server imports reads them, so a change to them must not replace the server (which
# costs a torch import) and the server must not keep a stale value. Each rank still gets the
# launcher's own value. pytest names the running test and its phase in PYTEST_CURRENT_TEST.
# The servers take this as their `momentary` parameter (docs/maintainers.md).
MOMENTARY_VARIABLES = frozenset({"PYTEST_CURRENT_TEST"})


class RunnerError(RuntimeError):
    """The runner cannot be what was asked for; the message says what to do."""


def nvidia_gpu_count() -> int:
    """How many NVIDIA GPUs the CUDA driver can use (0 without one), without importing torch."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            libcuda = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def grading() -> bool:
    """True inside the grader's kernels."""
    return os.environ.get(GRADING_VARIABLE) == "1"


def fresh_ranks(environ=os.environ) -> bool:
    """True where every rank starts in a fresh interpreter, not forked from a warm server
    (GPULAB_FRESH_RANKS, read here and nowhere else; at each launch, so a cell may set it)."""
    return environ.get(FRESH_RANKS_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def state_dir(environ=os.environ) -> Path:
    """Where gpulab keeps a learner's small state (the hints seen): GPULAB_STATE_DIR, else
    $XDG_STATE_HOME/gpulab, else ~/.local/state/gpulab."""
    if environ.get(STATE_DIR_VARIABLE):
        return Path(environ[STATE_DIR_VARIABLE]).expanduser()
    base = environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser() / "gpulab"


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


@dataclass(frozen=True)
class AutocastRecipe:
    """How to run mixed precision on this device."""

    device_type: str  # what torch.autocast takes: "cuda", "mps", "xpu" or "cpu"
    dtype_name: str  # "bfloat16" or "float16"
    use_grad_scaler: bool  # fp16 needs loss scaling to keep small gradients; bf16 has fp32's range

    @property
    def dtype(self):
        import torch

        return getattr(torch, self.dtype_name)


@dataclass(frozen=True)
class Runner:
    """The kind of machine gpulab runs on, decided once at import."""

    name: str  # "cpu" or "gpu"
    requested: str  # the GPULAB_RUNNER value that chose it: "auto", "cpu" or "gpu"
    gpu_count: int  # NVIDIA GPUs the driver reports (0 on the cpu runner without a GPU)
    in_colab: bool  # running inside Google Colab

    @property
    def simulator(self) -> bool:
        """Numba kernels run on Numba's CUDA simulator (the cpu runner) rather than a GPU."""
        return self.name == "cpu"

    def pick(self, cpu, gpu):
        """The value for this runner: problem sizes and tolerances differ, code does not."""
        return gpu if self.name == "gpu" else cpu

    @cached_property
    def device_kind(self) -> str:
        """The torch device type: "cuda" (NVIDIA or ROCm), "mps", "xpu" or "cpu"."""
        if self.name == "gpu":
            return "cuda"
        if self.requested == "cpu":  # asked for the cpu runner: stay on the CPU
            return "cpu"
        import torch

        if torch.cuda.is_available():  # ROCm builds answer here too
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return "xpu"
        return "cpu"

    @property
    def device(self):
        """A torch.device for this runner."""
        import torch

        return torch.device(self.device_kind)

    @property
    def backend(self) -> str:
        """The torch.distributed backend: nccl between CUDA GPUs, gloo everywhere else."""
        if self.device_kind == "cuda":
            import torch.distributed as dist

            if dist.is_nccl_available():
                return "nccl"
        return "gloo"

    @cached_property
    def autocast(self) -> AutocastRecipe:
        """bf16 where the device supports it, else fp16 with a GradScaler; bf16 on the CPU."""
        kind = self.device_kind
        if kind == "cuda":
            import torch

            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
            return AutocastRecipe("cuda", "bfloat16" if bf16 else "float16", not bf16)
        if kind == "mps":
            return AutocastRecipe("mps", "float16", True)
        # fp16 matmuls on a CPU are emulated and ~100x slower than bf16, so the CPU uses bf16.
        return AutocastRecipe(kind, "bfloat16", False)


def detect(environ=os.environ, gpu_count=nvidia_gpu_count) -> Runner:
    """Decide the runner from GPULAB_RUNNER and the hardware. Raises RunnerError when impossible."""
    requested = environ.get("GPULAB_RUNNER", "auto").strip().lower() or "auto"
    if requested not in RUNNER_CHOICES:
        raise RunnerError(
            f"GPULAB_RUNNER={requested!r} is not one of {', '.join(RUNNER_CHOICES)}. "
            "Unset it to let gpulab choose, or set it to 'cpu' or 'gpu'."
        )
    n_gpus = gpu_count()
    if requested == "gpu" and n_gpus == 0:
        raise RunnerError(
            "GPULAB_RUNNER=gpu, but no NVIDIA GPU is usable here (the CUDA driver reports none). "
            "On Colab: Runtime > Change runtime type > GPU. Elsewhere: check `nvidia-smi`, or "
            "unset GPULAB_RUNNER to use the cpu runner."
        )
    name = "cpu" if requested == "cpu" or n_gpus == 0 else "gpu"
    return Runner(name=name, requested=requested, gpu_count=n_gpus, in_colab=in_colab())


def switch_simulator(runner: Runner, environ=os.environ, modules=sys.modules) -> None:
    """Turn Numba's CUDA simulator on (cpu runner) or off (gpu runner) before numba.cuda loads.

    numba.cuda picks the simulator or the real driver when it is first imported, and a kernel
    cannot change it afterwards. So a notebook must `import gpulab` before `numba.cuda`.
    """
    want = "1" if runner.simulator else "0"
    cuda = modules.get("numba.cuda")
    if cuda is not None:
        has_sim = cuda.jit.__module__.startswith("numba.cuda.simulator")
        if has_sim != runner.simulator:
            loaded = "the CUDA simulator" if has_sim else "the real CUDA driver"
            raise RunnerError(
                f"numba.cuda was imported before gpulab and loaded {loaded}, but the "
                f"{runner.name} runner needs {'the simulator' if runner.simulator else 'a GPU'}. "
                "Restart the kernel (Kernel > Restart) and run `import gpulab` before anything "
                "that imports numba.cuda."
            )
        return
    environ["NUMBA_ENABLE_CUDASIM"] = want
    config = modules.get("numba.core.config")
    if config is not None:  # numba itself was imported already: make it re-read the variable
        config.reload_config()
