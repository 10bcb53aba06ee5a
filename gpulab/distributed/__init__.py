"""torch.distributed from a notebook: launch ranks, collectives, their cost.

    from gpulab.distributed import run_on_ranks
    run_on_ranks(fn, 2)          # fn(rank, world_size) on 2 processes, values in rank order

launch.py        run_on_ranks / Launcher: a notebook-defined function on N processes
torchrun.py      torchrun_script: a script written from a cell, under torchrun
collectives.py   what each collective does (pictures), ring and tree all-reduce from send/recv
cost_model.py    the alpha-beta model, algbw/busbw as nccl-tests reports them, fitting
errors.py        RankError, LaunchTimeout, ProcessGroupStartError

Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from gpulab.distributed.allreduce import ring_all_reduce, tree_all_reduce
from gpulab.distributed.errors import (
    LaunchError,
    LaunchTimeout,
    ProcessGroupStartError,
    RankError,
)
from gpulab.distributed.launch import Launcher, run_on_ranks
from gpulab.distributed.torchrun import TorchrunResult, torchrun_script

__all__ = ["Launcher", "LaunchError", "LaunchTimeout", "ProcessGroupStartError", "RankError",
           "TorchrunResult", "ring_all_reduce", "run_on_ranks", "torchrun_script",
           "tree_all_reduce"]
