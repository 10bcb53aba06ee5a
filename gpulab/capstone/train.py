"""What every rank of a capstone run does, at the end of the script that gpulab.capstone.launch
writes: the learner's shard_model, save_checkpoint and load_checkpoint (copied from the notebook)
called from gpulab's training loop.

    main(globals(), work_dir, {"shard_model": "shard_model", "save_checkpoint": ..., ...})

work_dir/spec.json     written by the launcher: the CapstoneConfig, the ParallelPlan and the run's
                       options (steps, checkpoint folder, the step to measure, to profile, to die)
work_dir/rank{N}.json  written here at the end: this rank's losses (float.hex, to compare bit for
                       bit), the step it started from, its measured peak, its profile breakdown,
                       and what the model looked like after shard_model

Each step: n_micro = grad_accum_steps microbatches of this dp rank's share (data.rank_batch),
loss / n_micro backward each (FSDP2 reduce-scatters each microbatch's gradients, so only the
sharded gradient is kept between them), then AdamW's step; fp16 adds a GradScaler. The logged
loss is the mean over the ranks, all-reduced. A checkpoint every checkpoint_every steps.
Fault injection: spec kill_at_step=s makes rank kill_rank SIGKILL itself at the start of step s,
on the first attempt only (a file, work_dir/killed, says it happened); with --max-restarts 1
torchrun restarts the group and it resumes.
A preemption notice (Part 4): with spec record_dir, the learner's install_notice_handler() runs
before the first step and handle_notice(folder, model, optimizer, steps_done) after every step;
every save goes through preemption.SaveRecorder, and the state load_checkpoint restored is
digested into the rank's record, for the checker to compare with what was saved.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.capstone.config import CapstoneConfig
from gpulab.capstone.data import rank_batch
from gpulab.capstone.measure import PeakMeter, describe_model
from gpulab.capstone.plan import ParallelPlan, make_mesh
from gpulab.capstone.preemption import SaveRecorder, state_digest
from gpulab.capstone.profile import profile_step
from gpulab.models import GPT

ROLES = ("shard_model", "save_checkpoint", "load_checkpoint", "install_notice_handler",
         "handle_notice")
# Starts the lines a run shows as it goes (run_capstone's progress=True prints only these).
PROGRESS = "progress: "


class ReturnError(TypeError):
    """A learner's function returned something the loop cannot use; the message says what."""


def _device():
    import gpulab  # the runner, decided once at import (LocalCluster passes the caller's on)

    if gpulab.runner.device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def main(namespace: dict, work_dir: str, graded: dict[str, str]) -> None:
    torch.set_num_threads(1)  # a fixed summation order in each matmul: runs compare bit for bit
    work = Path(work_dir)
    spec = json.loads((work / "spec.json").read_text())
    config, plan = CapstoneConfig(**spec["config"]), ParallelPlan(**spec["plan"])
    device = _device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    fns = {role: namespace[graded[role]] if graded.get(role) else None for role in ROLES}
    if spec.get("record_dir") and fns["save_checkpoint"] is not None:
        # The learner's own calls (from handle_notice, say) look the name up in the script.
        fns["save_checkpoint"] = namespace[graded["save_checkpoint"]] = SaveRecorder(
            fns["save_checkpoint"], Path(spec["record_dir"]), dist.get_rank())
    record = train(config, plan, spec, fns, device, work / "loss_log.jsonl")
    (work / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.barrier()  # nobody leaves while another rank may still need a connection
    dist.destroy_process_group()


def train(config: CapstoneConfig, plan: ParallelPlan, spec: dict, fns: dict, device,
          loss_log: Path) -> dict:
    """The training loop on this rank (the process group is up); returns plain values only.
    Rank 0 appends each step's loss to loss_log as it goes: an attempt that is killed leaves its
    steps there, and the steps a resumed attempt replays must match them bit for bit."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = make_mesh(plan, device.type)
    dp_rank = mesh["dp"].get_local_rank()
    torch.manual_seed(config.seed)  # every rank builds the same whole model, then shards it
    model = fns["shard_model"](GPT(config.model), mesh, plan)
    if not isinstance(model, torch.nn.Module):
        raise ReturnError(f"shard_model returned {type(model).__name__}; return the model "
                          "(fully_shard changes it in place: return the same object)")
    model.to(device)  # FSDP2 already put its shards on the mesh's device; the rest follows
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(device.type) if plan.precision == "fp16" else None
    folder = Path(spec["checkpoint_dir"]) if spec.get("checkpoint_dir") else None
    start = 0
    if folder is not None and fns["load_checkpoint"] is not None:
        folder.mkdir(parents=True, exist_ok=True)
        start = fns["load_checkpoint"](folder, model, optimizer)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ReturnError(f"load_checkpoint returned {start!r}; return the step to resume "
                              "from, an int (0 when the folder holds no checkpoint)")
        if start and rank == 0:
            print(f"{PROGRESS}resuming from the checkpoint of step {start}", flush=True)
    resumed = state_digest(model, optimizer) if spec.get("record_dir") else None
    if fns["install_notice_handler"] is not None:
        fns["install_notice_handler"]()
    # Not TORCHELASTIC_RESTART_COUNT: across nodes only the failed node's agent counts a
    # restart, and the c10d rendezvous may renumber the ranks, so a file marks the kill.
    killed = loss_log.with_name("killed")
    attempt = int(killed.exists())
    kill_rank = spec.get("kill_rank", world_size - 1)
    meter, profile = PeakMeter(model, optimizer, device), None
    losses = []
    for step in range(start, spec["steps"]):
        if step == spec.get("kill_at_step") and rank == kill_rank and not attempt:
            print(f"{PROGRESS}rank {rank} kills itself at the start of step {step}; torchrun "
                  "will restart the group", flush=True)
            killed.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        run = lambda s=step: _step(model, optimizer, scaler, config, plan, s, dp_rank,  # noqa: E731
                                   meter.next_microbatch)
        if step == spec.get("measure_step"):
            with meter:
                loss = run()
        elif step == spec.get("profile_step"):
            loss, profile = profile_step(run, device)
        else:
            loss = run()
        dist.all_reduce(loss)  # every rank's mean loss; a tp group's ranks agree
        losses.append((loss / world_size).item())
        if rank == 0:
            with open(loss_log, "a") as log:
                log.write(json.dumps({"attempt": attempt, "step": step,
                                      "loss": losses[-1].hex()}) + "\n")
            print(f"{PROGRESS}step {step}: loss {losses[-1]:.4f}", flush=True)
        if folder is not None and fns["save_checkpoint"] is not None and (
                (step + 1) % config.checkpoint_every == 0):
            fns["save_checkpoint"](folder, model, optimizer, step + 1)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not complete
        if fns["handle_notice"] is not None:  # a step boundary: the learner's to stop at
            fns["handle_notice"](folder, model, optimizer, step + 1)
    return {"rank": rank, "node": int(os.environ.get("GROUP_RANK", -1)),
            "restart_count": attempt,
            "dp_rank": dp_rank, "tp_rank": mesh["tp"].get_local_rank(),
            "start_step": start, "losses": [v.hex() for v in losses],
            "peak_bytes": meter.peak_bytes, "peak_by_kind": meter.by_kind,
            "profile": profile, "model": describe_model(model), "resumed_digest": resumed}


def _step(model, optimizer, scaler, config, plan, step: int, dp_rank: int, before_micro):
    """One optimizer step over plan.grad_accum_steps microbatches; the mean loss (a tensor)."""
    n_micro, device = plan.grad_accum_steps, next(model.parameters()).device
    total = torch.zeros((), device=device)
    for micro in range(n_micro):
        before_micro()
        x, y = rank_batch(config, step, dp_rank, plan.dp_size, micro, n_micro)
        logits = model(x.to(device))  # (B, T, V), in the plan's param_dtype
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()) / n_micro
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
