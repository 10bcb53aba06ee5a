"""The same pipeline through torch.distributed.pipelining: PipelineStage and ScheduleGPipe or
Schedule1F1B around a stage module from split_gpt.

    stages = split_gpt(gpt, pp_size)
    pipe = torch_pipeline(stages[pp_rank], pp_rank, pp_size, n_microbatches=4,
                          loss_fn=cross_entropy, schedule="1F1B", group=groups.pp)
    losses = pipe.step(x, y)        # the whole batch; the first stage uses x, the last y and
                                    # returns the microbatch losses; gradients in the stage

What torch does that run_pipeline (pipeline.py) does by hand, and where they differ (torch
2.13, torch/distributed/pipelining/schedules.py and stage.py):
- it splits the batch itself (tensor_split along dim 0, inputs and targets alike);
- shapes: inferred from the first microbatch and sent ahead as Python objects
  (send_object_list), where run_pipeline sends one small header tensor;
- scaling: each microbatch's loss is backpropagated unscaled and the summed gradients are
  divided by m at the end (scale_grads=True), where run_pipeline backpropagates loss / m:
  the same gradients, up to rounding;
- Schedule1F1B refuses n_microbatches < pp_size (ValueError); one_f_one_b_order runs any m
  (stage s holds min(p - s, m): with m < p the first stages hold all m, as in GPipe);
- Schedule1F1B posts a forward's send with the next backward's receive (and a backward's send
  with the next forward's receive) in one batch_isend_irecv, the pairing run_pipeline makes,
  but then waits for the whole batch, sends included; run_pipeline waits only for receives.
Both schedules run on CPU with gloo (the tests compare their loss and gradients with the
unsplit model's, for p = 2 and 4).

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["TORCH_SCHEDULES", "TorchPipeline", "torch_pipeline"]

TORCH_SCHEDULES = ("GPipe", "1F1B")


@dataclass(frozen=True)
class TorchPipeline:
    """One rank's stage of a torch.distributed.pipelining pipeline, and its schedule."""

    stage: Any  # torch.distributed.pipelining.PipelineStage
    schedule: Any  # ScheduleGPipe or Schedule1F1B built on it

    def step(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> list[float]:
        """One forward and backward of the whole batch: the first stage feeds x, the last
        compares with y (other stages may pass them too; they are ignored). Returns each
        microbatch's loss on the last stage ([] elsewhere); the gradients are in the stage
        module's parameters (accumulated: zero them between steps)."""
        losses: list[torch.Tensor] = []
        args = (x,) if self.stage.is_first else ()
        if self.stage.is_last:
            self.schedule.step(*args, target=y, losses=losses)
        else:
            self.schedule.step(*args)
        return [loss.item() for loss in losses]


def torch_pipeline(module: nn.Module, stage: int, n_stages: int, n_microbatches: int, loss_fn,
                   schedule: str = "1F1B", group=None,
                   device: torch.device | str | None = None) -> TorchPipeline:
    """torch.distributed.pipelining's PipelineStage and schedule for this rank's stage.
    group: the pipeline's process group (its ranks in stage order); None: the default group.
    device: where the stage runs (default: its parameters' device)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    if schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule must be one of {TORCH_SCHEDULES}, got {schedule!r}")
    if device is None:
        param = next(module.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    torch_stage = PipelineStage(module, stage, n_stages, torch.device(device), group=group)
    kind = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
    return TorchPipeline(torch_stage, kind(torch_stage, n_microbatches, loss_fn=loss_fn))
