"""A hang planted on purpose: one rank skips one collective of a training step, and the launcher's
report says where every rank was waiting when the time limit stopped them.

    hang = hang_for("ada")          # PlantedHang(world_size=4, skipper=2, missing="all_reduce")
    report = plant(hang)            # the LaunchTimeout's text of a real run_on_ranks launch
    print(report)                   # "rank 0: waiting in all_reduce (called at hang.py:61) ..."

The step calls COLLECTIVES in order, each one that every rank must join (no root: a rooted
collective such as broadcast lets some ranks through, and the report would be ambiguous). The
rank that skips one walks on into the next, where it waits alone, or finishes when it skipped the
last; the others wait in the one it skipped. Which rank skips which collective, and on how many
ranks, is drawn from the learner's id as the quiz draws its numbers (a sha256 of a salt, the id
and the field), so two learners' reports differ; the grader draws it outside the learner's
kernel (gpulab.checks.capstone ANSWERS) and plants it for real.
Taught in: lessons/04_distributed_fundamentals.ipynb (LaunchTimeout); the capstone
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from gpulab.quiz.variant import HUB_USER  # the grader sets it to the student who handed it in

# One sharded training step's collectives, in the order each rank calls them.
COLLECTIVES = ("all_gather", "all_to_all_single", "reduce_scatter_single", "all_reduce",
               "barrier")
WORLD_SIZES = (3, 4)  # a majority still waits in the missing collective
SALT = "gpulab capstone, planted hang, edition 1"
HANG_TIMEOUT_S = 2.0  # the hang's time limit: every rank is in its collective within ms


@dataclass(frozen=True)
class PlantedHang:
    """Which rank skips which collective, on how many ranks."""

    world_size: int
    skipper: int  # never rank 0: the first rank of the report is always one that waits
    missing: str  # one of COLLECTIVES


def hub_user() -> str:
    """Whose notebook this is: JupyterHub's user ("" outside a hub, where a fixed draw is used)."""
    return os.environ.get(HUB_USER, "").strip()


def hang_for(learner: str, draw: str = "") -> PlantedHang:
    """`learner`'s hang; another `draw` name gives the same learner another one."""

    def pick(field: str, options: tuple):
        key = "\0".join((SALT, learner.strip(), draw, field)).encode()
        return options[int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % len(options)]

    world_size = pick("world_size", WORLD_SIZES)
    return PlantedHang(world_size, pick("skipper", tuple(range(1, world_size))),
                       pick("missing", COLLECTIVES))


def hung_step(rank: int, world_size: int, skipper: int, missing: str) -> None:
    """One step's collectives on small tensors; rank `skipper` leaves out `missing`."""
    import torch
    import torch.distributed as dist

    shard = torch.full((2,), float(rank))
    calls = {
        "all_gather": lambda: dist.all_gather([torch.empty(2) for _ in range(world_size)], shard),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(2 * world_size),
                                                            torch.ones(2 * world_size)),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(torch.empty(2),
                                                                    torch.ones(2 * world_size)),
        "all_reduce": lambda: dist.all_reduce(torch.ones(1)),
        "barrier": lambda: dist.barrier(),
    }
    for name in COLLECTIVES:
        if rank == skipper and name == missing:
            continue
        calls[name]()


def plant(hang: PlantedHang, timeout_s: float = HANG_TIMEOUT_S) -> str:
    """Run hung_step on hang.world_size ranks until the time limit stops them; return the
    launcher's report (LaunchTimeout's text: where each rank waited, and its Python stack)."""
    from gpulab.distributed import LaunchTimeout, run_on_ranks

    try:
        run_on_ranks(hung_step, hang.world_size, hang.skipper, hang.missing,
                     timeout_s=timeout_s, backend="gloo")
    except LaunchTimeout as report:
        return str(report)
    raise RuntimeError(f"the planted hang {hang} finished: every rank made every call")
