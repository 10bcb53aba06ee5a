"""A small data-parallel training run that survives a killed worker: DDP on gloo, a checkpoint
every k steps, and a resume from the last checkpoint when it starts. Run it under torchrun:

    from gpulab.distributed import LocalCluster, TRAIN_SCRIPT
    with LocalCluster(nodes=2, procs_per_node=1) as cluster:
        result = cluster.run(TRAIN_SCRIPT, ["--checkpoint-dir", folder, "--steps", "30"],
                             max_restarts=1, env={"GPULAB_FAULT_STEP": "12"})
    # or: torchrun --nnodes ... -m gpulab.distributed.cluster_train --checkpoint-dir DIR

Rank 0 ends with one line, `final: {"step": 30, "losses": [...], "params_sha256": ...}`, the
losses as float.hex() so that two runs compare bit for bit.

Fault injection (for the lesson and the tests): GPULAB_FAULT_STEP=s makes rank
GPULAB_FAULT_RANK (default: the last rank) SIGKILL itself at the start of step s, on torchrun's
first attempt only (TORCHELASTIC_RESTART_COUNT is 0). With --max-restarts 1 torchrun restarts
the whole group, which resumes from the last checkpoint.

Why the resumed run ends on exactly the uninterrupted run's loss:
- the batch of step s depends on (seed, s) alone, so replayed steps see the same samples;
- the checkpoint holds the weights and the optimizer's momentum, written atomically (a temp
  file, then os.replace: see gpulab.checkpoint), so a kill mid-save leaves the previous one;
- after the restart the ranks and the world size are the same, so gloo sums the gradients in
  the same order, and one thread per process keeps each matmul's summation order fixed.
A checkpoint must sit where every node can read it: here one folder on one machine; on a real
cluster, a shared file system.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (multi-node launch)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import signal
from pathlib import Path

TRAIN_SCRIPT = Path(__file__).resolve()  # what LocalCluster.run (or torchrun) is given
N_SAMPLES, N_FEATURES = 512, 16


def batch_indices(seed: int, step: int, batch_size: int, rank: int, world_size: int):
    """This rank's share of step `step`'s batch: a function of (seed, step) alone."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    batch = torch.randperm(N_SAMPLES, generator=generator)[:batch_size]  # (batch_size,)
    return batch[rank::world_size]  # (batch_size // world_size,)


def make_data(seed: int):
    """A fixed regression problem: y = sin(x @ w) + noise, x of shape (N_SAMPLES, N_FEATURES)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N_SAMPLES, N_FEATURES, generator=generator)
    w = torch.randn(N_FEATURES, 1, generator=generator)
    y = torch.sin(x @ w) + 0.1 * torch.randn(N_SAMPLES, 1, generator=generator)
    return x, y


def params_sha256(model) -> str:
    """A fingerprint of every parameter's exact bits."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def _fault(rank: int, world_size: int) -> int | None:
    """The step at which this rank must kill itself, or None (read once, in main)."""
    step = os.environ.get("GPULAB_FAULT_STEP")
    victim = int(os.environ.get("GPULAB_FAULT_RANK", world_size - 1))
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return int(step) if step and rank == victim and first_attempt else None


def train(opts) -> dict:
    """The training loop on this rank (the process group is up); returns plain values only."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from gpulab.checkpoint import TrainState, load_checkpoint, save_checkpoint
    from gpulab.models import MLP

    rank, world_size = dist.get_rank(), dist.get_world_size()
    if opts.batch_size % world_size:
        raise ValueError(f"--batch-size {opts.batch_size} must divide by {world_size} ranks")
    torch.manual_seed(opts.seed)
    model = MLP(N_FEATURES, 1, hidden=32, n_hidden=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=0.9)
    path = opts.checkpoint_dir / "checkpoint.pt"
    state = TrainState()
    if path.exists():  # a restart (or a second run): continue where the last checkpoint was
        state = load_checkpoint(path, model, optimizer, None)
        print(f"resumed from step {state.step}", flush=True)
    ddp = DistributedDataParallel(model)
    x, y = make_data(opts.seed)
    fault_step = _fault(rank, world_size)

    for step in range(state.step, opts.steps):
        if step == fault_step:
            print(f"rank {rank} kills itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        shard = batch_indices(opts.seed, step, opts.batch_size, rank, world_size)
        loss = F.mse_loss(ddp(x[shard]), y[shard])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        state.losses.append((mean_loss / world_size).item())
        state.step = step + 1
        if state.step % opts.checkpoint_every == 0:
            if rank == 0:
                save_checkpoint(path, model, optimizer, None, state)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
    return {"step": state.step, "losses": [v.hex() for v in state.losses],
            "params_sha256": params_sha256(model)}


def main(argv=None) -> None:
    import gpulab  # noqa: F401 - first, as everywhere: it decides the runner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="global, over all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # a fixed summation order inside each matmul
    dist.init_process_group("gloo")
    result = train(opts)
    # DDP's reducer keeps the process group alive, in reference cycles: collect them now, so
    # that gloo's threads stop inside destroy_process_group and not while Python shuts down
    # (a process group destroyed during interpreter teardown can abort the process).
    gc.collect()
    if dist.get_rank() == 0:
        print("final: " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
