"""Runner profiles: the kind of machine a submission is graded on, and what that changes.

    cpu   Numba's CUDA simulator; a simulated kernel costs seconds, so cells get 180 s
    gpu   a real NVIDIA GPU; 60 s per cell is generous, and a GPU-less machine is refused at once

The profile sets the grading kernel's environment, its time limits and the sandbox's resource
limits (autograder/sandbox.py). The kernel's own `import gpulab` reads GPULAB_RUNNER and turns the
simulator on or off (gpulab/env.py), exactly as in a learner's notebook, so a lab is graded by the
same code path it was written against.

Limits are per kernel process (rlimits), sized for what a lab needs plus room: Lab 1's kernel
peaks near 300 MB of data and 2 GB of address space on the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from autograder.sandbox import GIB, SandboxSettings


class ProfileError(RuntimeError):
    """The profile cannot be used here; the message says what to do."""


@dataclass(frozen=True)
class RunnerProfile:
    """How to grade on one kind of machine."""

    name: str  # "cpu" or "gpu", also the value of GPULAB_RUNNER in the grading kernel
    cell_timeout_s: int  # per cell; nbgrader's default of 30 s is too short for the simulator
    submission_timeout_s: int  # the whole submission, kernel start to last cell, a backstop
    needs_gpu: bool  # refuse to start without an NVIDIA GPU
    env: Mapping[str, str] = field(default_factory=dict)  # set in the grading kernel
    # The sandbox (autograder/sandbox.py, where each limit is explained): per kernel process.
    sandboxed: bool = True  # False only by `grade --no-sandbox`, for code the instructor trusts
    cpu_time_s: int = SandboxSettings.cpu_time_s
    memory_bytes: int = SandboxSettings.memory_bytes
    address_space_bytes: int = SandboxSettings.address_space_bytes
    max_processes: int = SandboxSettings.max_processes
    max_file_bytes: int = SandboxSettings.max_file_bytes
    tmp_bytes: int = SandboxSettings.tmp_bytes
    thread_stack_bytes: int = SandboxSettings.thread_stack_bytes

    def sandbox_settings(self) -> SandboxSettings:
        """What the grading kernel's sandbox enforces on this profile."""
        return SandboxSettings(
            enabled=self.sandboxed,
            gpu=self.needs_gpu,
            cpu_time_s=self.cpu_time_s,
            memory_bytes=self.memory_bytes,
            address_space_bytes=self.address_space_bytes,
            max_processes=self.max_processes,
            max_file_bytes=self.max_file_bytes,
            tmp_bytes=self.tmp_bytes,
            thread_stack_bytes=self.thread_stack_bytes,
        )

    def kernel_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The grading kernel's environment: `base` with this profile's variables on top."""
        environ = dict(base)
        # The grader's own shell may have picked a simulator setting (importing gpulab does);
        # drop it so that the kernel's `import gpulab` decides from GPULAB_RUNNER alone.
        environ.pop("NUMBA_ENABLE_CUDASIM", None)
        environ.update(self.env)
        return environ

    def check_available(self, gpu_count: Callable[[], int] | None = None) -> None:
        """Raise ProfileError now, before any submission is touched, if this machine cannot."""
        if not self.needs_gpu:
            return
        if gpu_count is None:
            from gpulab.env import nvidia_gpu_count as gpu_count
        if gpu_count() == 0:
            raise ProfileError(
                f"the {self.name} runner needs an NVIDIA GPU, and the CUDA driver reports none on "
                "this machine. Grade with `--runner cpu` here (the CUDA simulator, small sizes), "
                "or run the same command on a machine where `nvidia-smi` lists a GPU."
            )


def _frozen(mapping: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


# A grading kernel has no display: pictures render off-screen. GPULAB_GRADING: a learner's
# gpulab.progress() cell does not run the visible checks again (the grader runs them).
_COMMON = {"MPLBACKEND": "Agg", "GPULAB_GRADING": "1"}
# One intra-op thread per grading kernel on the cpu runner: --jobs spreads kernels over the
# cores. With a thread per core, kernels beside each other (or any other load) oversubscribe
# the cores, and PyTorch's threads wait for one another at every op: a small MLP's forward and
# backward take ten times as long, and a profile's shares turn over (Lab 4's "data" phase went
# from 60% of a step to 10%). The checkers already time on one thread (one_thread).
CPU_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

PROFILES: Mapping[str, RunnerProfile] = _frozen(
    {
        "cpu": RunnerProfile(
            name="cpu",
            cell_timeout_s=180,
            submission_timeout_s=3600,
            needs_gpu=False,
            env=_frozen({**_COMMON, **CPU_THREADS, "GPULAB_RUNNER": "cpu"}),
        ),
        "gpu": RunnerProfile(
            name="gpu",
            cell_timeout_s=60,
            submission_timeout_s=1800,
            needs_gpu=True,
            env=_frozen({**_COMMON, "GPULAB_RUNNER": "gpu"}),
            cpu_time_s=1800,
            memory_bytes=16 * GIB,  # pinned buffers and data loaders live in host memory
            address_space_bytes=0,  # the CUDA driver maps the GPU into the address space
        ),
    }
)


def get_profile(name: str) -> RunnerProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ProfileError(
            f"no runner profile {name!r}; choose one of {', '.join(PROFILES)}."
        ) from None
