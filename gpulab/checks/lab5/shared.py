"""What Lab 5's tensor-parallel checkers share (tp_linear.py: Part 1, tp_mlp.py: Part 2):
launching the learner's classes on groups of gloo ranks, naming a rank in a message, comparing
with the unsharded reference, and reading the collectives each rank made.

    world_size, groups = layout(tp=2, world_size=4)    # [[0, 2], [1, 3]]: strided groups
    results = run(lab5_ranks.tp_mlp_rank, world_size, TPMLP, data, name=..., case=...)
    close(got, want)                                   # equal up to float32 rounding
    check_groups(name, calls, where)                   # every collective on the given group

With world_size > tp_size the groups are strided, so that neither the default group nor a
rank's place in the world (dist.get_rank()) is right for a group; each group gets other data.
A launch is harness.ranks.launch: a time limit, where each rank waited when they hang, the
learner's own lines when they raise. What runs on the ranks is in ranks.py, shipped by value.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import torch

from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab5 import ranks as lab5_ranks

TP_TIMEOUT_S = 30.0  # a few tiny layers: well under a second; a rank that waits: forever
RTOL = 1e-4  # float32 sums in another order: far closer than this, relative to the largest


# ----------------------------------------------------------------------------- launching


def layout(tp: int, world_size: int | None) -> tuple[int, list[list[int]]]:
    """(world_size, the groups as lists of global ranks); world_size None: one group of tp."""
    world_size = world_size or tp
    if tp < 1 or world_size % tp:
        raise ValueError(f"world_size={world_size} must be a multiple of tp={tp}")
    n_groups = world_size // tp  # strided: rank r is in group r % n_groups
    return world_size, [[g + k * n_groups for k in range(tp)] for g in range(n_groups)]


def case_label(tp: int, world_size: int, groups: list[list[int]]) -> str:
    """How a failure names the launch: "tp_size=2", or "tp_size=2, 2 groups in 4 ranks"."""
    return f"tp_size={tp}" + (f", {len(groups)} groups in {world_size} ranks"
                              if len(groups) > 1 else "")


def _crash(error, logs) -> str | None:
    if "incorrect number of gradients" in error.traceback:
        return ("An autograd Function's backward returns one gradient per argument of forward: "
                "forward(ctx, x, group) takes two, so backward returns (grad_x, None), None for "
                "the group.")
    if "does not require grad" in error.traceback:
        return ("The output does not need a gradient: forward must compute it from its input "
                "(or from the parameters) inside the graph, not from .detach() or .data.")
    return None


def _hang(error, logs) -> str:
    return ("A rank waited for a collective the other ranks of its group never made. Every rank "
            "of a group must make the same collectives in the same order (none under `if "
            "dist.get_rank(group) == 0:`), on the group it was given.")


def run(fn, world_size, *args, name: str, case: str):
    """fn(rank, world_size, *args, log_dir) on gloo ranks, as harness.ranks.launch runs it."""
    return launch(fn, world_size, *args, name=name, case=case, timeout_s=TP_TIMEOUT_S,
                  ship=(lab5_ranks,), explain_hang=_hang, explain_crash=_crash)


class RankView:
    """Rank r's place: its group, its index in the group, and how to name it in a message."""

    def __init__(self, rank: int, groups: list[list[int]]):
        self.rank = rank
        self.group = next(g for g, ranks in enumerate(groups) if rank in ranks)
        self.me = groups[self.group].index(rank)
        self.ranks = groups[self.group]
        self.subgroup = len(groups) > 1

    def __str__(self) -> str:
        if not self.subgroup:
            return f"rank {self.rank}"
        return f"rank {self.rank} (rank {self.me} of its group, ranks {self.ranks})"


# ----------------------------------------------------------------------------- comparing


def close(got, want) -> bool:
    """got is a tensor of want's shape, equal up to float32 rounding (RTOL of the largest)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    diff = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
    return diff <= RTOL * max(1.0, float(want.abs().max()) if want.numel() else 1.0)


def err(got, want) -> str:
    """How got differs from want, in a few words."""
    if got is None:
        return "it is None: nothing reached it"
    if not isinstance(got, torch.Tensor):
        return f"it is {got}, not a tensor"
    if got.shape != want.shape:
        return f"its shape is {tuple(got.shape)}, expected {tuple(want.shape)}"
    return f"off by up to {float((got.double() - want.double()).abs().max()):.3g}"


def phase_kind(phase: str) -> str:
    """"forward", "backward" or "init", from a phase lab5_ranks recorded."""
    return "backward" if "backward" in phase else "forward" if "forward" in phase else "init"


def check_groups(name: str, calls, where) -> None:
    """AssertionError unless every recorded collective went to the group passed in."""
    for call, phase, group, _ in calls:
        if group == "given":
            continue
        which = ("the default group (group=None: every rank of the world)" if group == "default"
                 else "another group than the one it was given")
        raise AssertionError(
            f"{name}, {where}: dist.{call} in {phase.split(', ')[0]} went to {which}. Pass "
            "the group you were given to every collective (dist.all_reduce(t, group=group); "
            "keep it in ctx.group or self.group), and use dist.get_rank(group) and "
            "dist.get_world_size(group): in Part 4 a tensor-parallel group is a subgroup of "
            "the world.")


def check_counts(name: str, calls, where, forward: int, backward: int) -> None:
    """AssertionError unless forward and backward made exactly that many all-reduces, and no
    other collective (checked after the numbers, which would show a missing one first)."""
    for kind, want in (("forward", forward), ("backward", backward)):
        made = [c for c, phase, _, _ in calls if phase_kind(phase) == kind]
        if made != ["all_reduce"] * want:
            said = ", ".join(f"dist.{c}" for c in made) or "no collective"
            raise AssertionError(
                f"{name}, {where}: its {kind} made {said}; it should make "
                + ("exactly one dist.all_reduce." if want else "none.")
                + " The numbers came out right, so the extra work was wasted (or its result "
                "unused): f = CopyToTP is identity forward, all-reduce backward; g = "
                "ReduceFromTP is all-reduce forward, identity backward.")


def refuse_borrowed(name: str, results) -> None:
    """AssertionError when a rank ran gpulab's own tensor parallelism (harness.calls notes it)."""
    for r, res in enumerate(results):
        borrowed = res["borrowed"] if isinstance(res, dict) else res[-1]["borrowed"]  # cumulative
        if borrowed:
            raise AssertionError(f"{name} ran {borrowed[0]} on rank {r}: write it yourself in "
                                 "the notebook; gpulab's versions (lesson 06) earn no points.")


def require_function(cls, name: str) -> None:
    """AssertionError unless cls is an autograd Function written in the notebook."""
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        raise AssertionError(f"{name} is not an autograd Function (it is {cls!r:.60}). Define it "
                             f"with `class {name}(torch.autograd.Function):` and static methods "
                             "forward(ctx, x, group) and backward(ctx, grad).")
    require_own_class(cls, name)
