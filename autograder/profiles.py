"""Runner profiles: the kind of machine a submission is graded on, and what that changes.

    cpu   Numba's CUDA simulator; a simulated kernel costs seconds, so cells get 180 s
    gpu   a real NVIDIA GPU; 60 s per cell is generous, and a GPU-less machine is refused at once

The profile only sets the grading kernel's environment and time limits. The kernel's own
`import gpulab` reads GPULAB_RUNNER and turns the simulator on or off (gpulab/env.py), exactly
as in a learner's notebook, so a lab is graded by the same code path it was written against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


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


# A grading kernel has no display: pictures render off-screen.
_COMMON = {"MPLBACKEND": "Agg"}

PROFILES: Mapping[str, RunnerProfile] = _frozen(
    {
        "cpu": RunnerProfile(
            name="cpu",
            cell_timeout_s=180,
            submission_timeout_s=3600,
            needs_gpu=False,
            env=_frozen({**_COMMON, "GPULAB_RUNNER": "cpu"}),
        ),
        "gpu": RunnerProfile(
            name="gpu",
            cell_timeout_s=60,
            submission_timeout_s=1800,
            needs_gpu=True,
            env=_frozen({**_COMMON, "GPULAB_RUNNER": "gpu"}),
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
