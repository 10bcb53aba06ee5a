"""What a training run costs in the cloud: GPU-hours, dollars, spot against on-demand, and the
time that preemptions take back, as a function of the checkpoint interval.

    hours = training_hours(1.3e9, 26e9, "A100 40GB SXM", n_gpus=8)    # 6·N·D FLOPs at 40% MFU
    run_cost_usd(usd_per_gpu_hour=3.67, n_gpus=8, hours=hours)           # on demand, no failures
    spot = estimate_run(hours, n_gpus=8, usd_per_gpu_hour=1.20, preemptions_per_hour=0.1,
                        checkpoint_interval_hours=0.5, restart_hours=0.1, save_hours=0.02)
    spot.wall_hours, spot.usd, spot.lost_usd

The preemption model, first order and in expectation: preemptions arrive at a steady rate λ per
hour of running. Each one loses the work done since the last checkpoint, on average half the
checkpoint interval τ, plus the restart r (a new VM, pulling the image, loading the checkpoint),
so every hour of running loses λ(τ/2 + r) hours: the preemption loss fraction. Saving a
checkpoint stops training for c hours every τ hours of work. A run of W hours of work then takes
    T = W (1 + c/τ) / (1 − λ(τ/2 + r))
hours of wall time, with every GPU paid for all of them. A short τ spends the time saving, a long
one redoing work: T is smallest near τ = sqrt(2c/λ) (Young's approximation, 1974).
All prices are parameters: gpulab.cloud_instances has illustrative ones, today's are on the
providers' pages.
Taught in: lessons/01_gpu_architecture.ipynb (what a run costs)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab.gpu_specs import get_gpu


def training_flops(params: float, tokens: float) -> float:
    """FLOPs to train a dense transformer: 6 per parameter per token (2 forward, 4 backward)."""
    return 6.0 * params * tokens


def training_hours(params: float, tokens: float, gpu, n_gpus: int, dtype: str = "bf16",
                   mfu: float = 0.4) -> float:
    """Wall hours to train on `n_gpus` of `gpu` running at `mfu` (model FLOP utilization: the
    fraction of the dense peak the run reaches; 0.3-0.5 is typical of well-tuned training)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu is a fraction of the peak, in (0, 1]; got {mfu}")
    flops_per_s = n_gpus * get_gpu(gpu).peak_tflops(dtype) * 1e12 * mfu
    return training_flops(params, tokens) / flops_per_s / 3600


def run_cost_usd(usd_per_gpu_hour: float, n_gpus: int, hours: float) -> float:
    """Dollars for `hours` of wall time on `n_gpus`: every GPU is billed while the run holds it."""
    return usd_per_gpu_hour * n_gpus * hours


def preemption_loss_fraction(preemptions_per_hour: float, checkpoint_interval_hours: float,
                             restart_hours: float = 0.0) -> float:
    """The expected share of each hour of running lost to preemptions: λ(τ/2 + r)."""
    return preemptions_per_hour * (checkpoint_interval_hours / 2 + restart_hours)


def max_checkpoint_interval(preemptions_per_hour: float, max_loss_fraction: float,
                            restart_hours: float = 0.0) -> float:
    """The longest checkpoint interval τ (hours) that keeps the preemption loss fraction at or
    below `max_loss_fraction`: λ(τ/2 + r) <= f gives τ <= 2(f/λ − r)."""
    if preemptions_per_hour <= 0:
        return math.inf
    interval = 2 * (max_loss_fraction / preemptions_per_hour - restart_hours)
    if interval <= 0:
        raise ValueError(
            f"the restarts alone lose {preemptions_per_hour * restart_hours:.1%} of the time, "
            f"more than the {max_loss_fraction:.1%} allowed, whatever the checkpoint interval: "
            "make restarts faster (image cached on the VM, checkpoint on fast storage) or accept "
            "a larger loss")
    return interval


def young_checkpoint_interval(save_hours: float, preemptions_per_hour: float) -> float:
    """The checkpoint interval (hours) that loses the least time: sqrt(2c/λ), where saving costs
    c hours and preemptions come λ per hour (Young, 1974; first order in c and 1/λ)."""
    if save_hours <= 0 or preemptions_per_hour <= 0:
        raise ValueError("needs a save time > 0 and a preemption rate > 0 (with either at 0 "
                         "there is nothing to balance: checkpoint as often, or as rarely, as "
                         "you like)")
    return math.sqrt(2 * save_hours / preemptions_per_hour)


@dataclass(frozen=True)
class RunEstimate:
    """The expected wall time and bill of one run, preemptions and checkpoints included."""

    work_hours: float  # the run's training time with no checkpoint and no preemption
    wall_hours: float  # expected wall time: work + saving + redone work + restarts
    n_gpus: int
    usd_per_gpu_hour: float
    expected_preemptions: float  # λ x wall_hours
    lost_hours: float  # redone work and restarts: expected_preemptions x (τ/2 + r)
    save_hours: float  # time spent writing checkpoints: work_hours x c/τ

    @property
    def usd(self) -> float:
        """The whole bill: wall_hours of every GPU."""
        return run_cost_usd(self.usd_per_gpu_hour, self.n_gpus, self.wall_hours)

    @property
    def lost_usd(self) -> float:
        """The expected cost of preemption: what the lost hours are billed."""
        return run_cost_usd(self.usd_per_gpu_hour, self.n_gpus, self.lost_hours)


def estimate_run(work_hours: float, n_gpus: int, usd_per_gpu_hour: float,
                 preemptions_per_hour: float = 0.0,
                 checkpoint_interval_hours: float | None = None, restart_hours: float = 0.0,
                 save_hours: float = 0.0) -> RunEstimate:
    """Expected wall time and dollars of a run of `work_hours` (see the module docstring).

    On demand: preemptions_per_hour=0 (the default). On spot: the rate you expect and the
    checkpoint interval and restart time of your setup; save_hours is one checkpoint's write.
    """
    if work_hours < 0 or n_gpus < 1 or usd_per_gpu_hour < 0:
        raise ValueError("need work_hours >= 0, n_gpus >= 1 and usd_per_gpu_hour >= 0")
    if checkpoint_interval_hours is None:
        if preemptions_per_hour > 0:
            raise ValueError("a run that can be preempted needs checkpoint_interval_hours: "
                             "without checkpoints every preemption starts it from scratch")
        checkpoint_interval_hours = math.inf
    if checkpoint_interval_hours <= 0:
        raise ValueError(f"checkpoint_interval_hours must be > 0, got {checkpoint_interval_hours}")
    saving = work_hours * save_hours / checkpoint_interval_hours
    lost_per_preemption = (checkpoint_interval_hours / 2 + restart_hours
                           if preemptions_per_hour > 0 else 0.0)
    loss = preemptions_per_hour * lost_per_preemption
    if loss >= 1:
        raise ValueError(
            f"preemptions take back {loss:.0%} of every hour (λ(τ/2 + r) >= 1): the run would "
            "never finish. Checkpoint more often, or use on-demand machines")
    wall = (work_hours + saving) / (1 - loss)
    preemptions = preemptions_per_hour * wall
    return RunEstimate(work_hours=work_hours, wall_hours=wall, n_gpus=n_gpus,
                       usd_per_gpu_hour=usd_per_gpu_hour, expected_preemptions=preemptions,
                       lost_hours=preemptions * lost_per_preemption, save_hours=saving)
