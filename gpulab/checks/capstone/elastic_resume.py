"""Capstone, Part 3: a killed worker, an elastic restart and a resume replayed bit for bit
(check_elastic_resume).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gpulab.capstone import capstone_config, reference_losses
from gpulab.checks.capstone.common import (
    launch_on_cluster,
    loss_tolerance,
    require_learner_code,
    require_valid_plan,
)


def check_elastic_resume(shard_model, save_checkpoint, load_checkpoint, plan, *,
                         steps: int = 6, checkpoint_every: int = 3, kill_at_step: int = 5,
                         seed: int = 0, isolation: str = "auto") -> None:
    """Kill a worker at the start of step kill_at_step; torchrun restarts the group, which must
    resume from the newest complete checkpoint (written by save_checkpoint with
    torch.distributed.checkpoint) and replay the steps since then bit for bit. At least two
    steps are replayed: the first one's loss depends on the weights alone, the second's on the
    update made with the optimizer's state too."""
    for fn, name in ((shard_model, "shard_model"), (save_checkpoint, "save_checkpoint"),
                     (load_checkpoint, "load_checkpoint")):
        require_learner_code(fn, name)
    config = capstone_config(None, seed=seed, checkpoint_every=checkpoint_every)
    require_valid_plan(plan, config)
    if kill_at_step - (kill_at_step // checkpoint_every) * checkpoint_every < 2:
        raise ValueError(f"kill_at_step={kill_at_step} must come at least 2 steps after a "
                         f"checkpoint (every {checkpoint_every}): a lost optimizer state shows "
                         "only in the second replayed step")
    folder = Path(tempfile.mkdtemp(prefix="gpulab-capstone-ckpt-"))
    try:
        run = launch_on_cluster("check_elastic_resume", {"shard_model": shard_model,
                                               "save_checkpoint": save_checkpoint,
                                               "load_checkpoint": load_checkpoint},
                      plan, config, steps=steps, checkpoint_dir=folder,
                      kill_at_step=kill_at_step, max_restarts=1, measure_step=None,
                      isolation=isolation)
        written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not any(Path(p).name == ".metadata" for p in written):
        raise AssertionError(f"save_checkpoint wrote {written[:6] or 'nothing'} into the "
                             "folder: write with torch.distributed.checkpoint (dcp.save of "
                             "get_state_dict(model, optimizer)), which leaves a .metadata file "
                             "beside each rank's shards.")
    first, second = run.attempt_losses(0), run.attempt_losses(1)
    newest = (kill_at_step // checkpoint_every) * checkpoint_every
    if not second:
        raise AssertionError("no step ran after the restart.")
    print(f"killed at step {kill_at_step}; resumed at step {run.start_step}; first attempt "
          f"{[round(v, 4) for v in first.values()]}, after the restart "
          f"{[round(v, 4) for v in second.values()]}")
    if run.start_step != newest:
        what = ("started over from step 0" if run.start_step == 0 else
                f"resumed at step {run.start_step}")
        raise AssertionError(f"after the restart the run {what}, but the newest complete "
                             f"checkpoint is step {newest}'s: load_checkpoint must load the "
                             "newest checkpoint in the folder and return its step.")
    for step in range(newest, kill_at_step):
        if second[step] != first[step]:
            raise AssertionError(
                f"step {step}, replayed after the resume, gave loss {second[step]!r}; before "
                f"the kill it gave {first[step]!r}. The resumed state is not the one that was "
                "saved: save and load the optimizer's state with the model's "
                "(get_state_dict(model, optimizer), then set_state_dict after dcp.load).")
    reference, tolerance = reference_losses(config, steps), loss_tolerance()
    for step, loss in second.items():
        if abs(loss - reference[step]) > tolerance:
            raise AssertionError(f"step {step} after the resume: loss {loss:.4f}, the "
                                 f"one-process reference {reference[step]:.4f}, though the "
                                 "replayed steps matched: something that shapes the later "
                                 "updates was not restored.")
