"""Logging a run: its scalars to TensorBoard event files, and to an offline W&B run.

    with RunLog(log_dir, config={"lr": 1e-3}, use_wandb=True) as log:
        for step in range(steps):
            loss = step_fn()
            log.scalars(step, loss=loss.detach(), lr=lr)    # a tensor stays on the device here
    read_scalars(log.tensorboard_dir)        # {"loss": [(0, 4.21), (1, 4.05), ...], "lr": ...}

Logging must not add a host-device sync to every step (Lesson 03): scalars() keeps tensors as
they are, and every `flush_every` steps one stack-and-copy brings all of them to the host, as
gpulab.train does with its losses.

TensorBoard: torch.utils.tensorboard.SummaryWriter appends event files (protocol-buffer records
in TFRecord framing) under log_dir/tensorboard; `tensorboard --logdir <log_dir>` serves them
on localhost, and read_scalars() reads them back as TensorBoard's own loader does.
Weights & Biases: with use_wandb and the wandb package installed, the same scalars go to a W&B
run in offline mode (no account, no network; mode="offline" is passed to wandb.init, so a
WANDB_MODE in the environment cannot switch it online), under log_dir/wandb, where
`wandb sync` can upload it later. Without wandb, the run logs to TensorBoard alone and
`wandb_status` says how to add it. Nothing here downloads anything.
Taught in: lessons/08_profiling_and_optimization.ipynb (logging a run)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

WANDB_MISSING = ("W&B: wandb is not installed, so this run logged to TensorBoard only. "
                 "`pip install wandb` and run again: the same scalars then also go to an "
                 "offline W&B run (no account, no network).")


def _summary_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch checks for the tensorboard package on import
        raise ImportError("TensorBoard logging needs the tensorboard package: "
                          "pip install tensorboard (gpulab's course extra has it)") from e
    return SummaryWriter(log_dir=str(log_dir))


def _start_wandb(log_dir: Path, project: str, config: dict):
    """(run, status line): an offline W&B run under log_dir, or (None, how to enable it)."""
    try:
        import wandb
    except ImportError:
        return None, WANDB_MISSING
    settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False)
    run = wandb.init(project=project, config=config, dir=str(log_dir), mode="offline",
                     settings=settings)
    run_dir = Path(run.dir).parent  # run.dir is the run's files/ folder
    return run, f"W&B: offline run in {run_dir}; `wandb sync {run_dir}` uploads it later."


class RunLog:
    """The scalars of one run, written to TensorBoard and, with use_wandb, to W&B offline.
    Use it as a context manager: leaving it writes what is queued and closes the files."""

    def __init__(self, log_dir, config: dict | None = None, *, use_wandb: bool = False,
                 flush_every: int = 50, project: str = "gpulab"):
        if flush_every < 1:
            raise ValueError(f"flush_every must be at least 1, got {flush_every}")
        self.log_dir = Path(log_dir)
        self.tensorboard_dir = self.log_dir / "tensorboard"
        self.config = dict(config or {})
        self.flush_every = flush_every
        self.steps_logged = 0
        self._pending: list[tuple[int, dict]] = []  # (step, {tag: float or device tensor})
        self._writer = _summary_writer(self.tensorboard_dir)
        if self.config:  # TensorBoard's TEXT tab shows it beside the curves
            self._writer.add_text("config", f"```\n{json.dumps(self.config, indent=2)}\n```")
        self._wandb = None
        self.wandb_status = "W&B: off (use_wandb=False)."
        if use_wandb:
            self._wandb, self.wandb_status = _start_wandb(self.log_dir, project, self.config)

    def scalars(self, step: int, **values) -> None:
        """Queue `values` (floats, or 0-d tensors on any one device) for `step`."""
        self._pending.append((step, values))
        self.steps_logged += 1
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write what is queued: one sync for all of its tensors, then the records."""
        if not self._pending:
            return
        tensors = [v for _, values in self._pending for v in values.values()
                   if isinstance(v, torch.Tensor)]
        on_host = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist()
                       if tensors else [])
        for step, values in self._pending:
            row = {tag: next(on_host) if isinstance(v, torch.Tensor) else float(v)
                   for tag, v in values.items()}
            for tag, value in row.items():
                self._writer.add_scalar(tag, value, global_step=step)
            if self._wandb is not None:
                self._wandb.log(row, step=step)
        self._pending.clear()
        self._writer.flush()

    def close(self) -> None:
        """Flush, close the event file and finish the W&B run."""
        self.flush()
        self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_scalars(tensorboard_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `tensorboard_dir`: {tag: [(step, value), ...]},
    read with TensorBoard's own event loader, as its web page would show them."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    events = EventAccumulator(str(tensorboard_dir), size_guidance={SCALARS: 0})  # 0: keep all
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()[SCALARS]}
