"""Lab 3, Part 5's checker passes the solution's ShardedAdamW, and another right design (each
gradient reduced to its owner, each parameter broadcast from it), and fails, with the message
that names the mistake, the wrong versions learners write: the whole AdamW state on every rank,
shards stepped with their own rank's gradient, no gathering after the step, a whole-model buffer
kept on the optimizer, AdamW's state started afresh every step, an all-reduce of the gradients
or of the parameters (1.5 times DDP's traffic), shares too uneven, and lesson 05's
ZeroOneOptimizer borrowed. Each check is one launch of 2 or 3 processes (about 2 s).
"""

import re
import types

import pytest
from lab_submissions import Lab, cell_by_grade_id

from gpulab.checks.lab3 import check_sharded_adamw
from gpulab.checks.lab3.sharded_adamw import expected_sharded_adamw

pytestmark = [pytest.mark.dist, pytest.mark.lab3]

SOLUTION = Lab("lab3_ddp_from_scratch").solution()
CELL_FILE = "/tmp/ipykernel_0/cell.py"  # where a kernel's cells say they come from


@pytest.fixture(scope="module")
def want():
    return expected_sharded_adamw()  # the answer key, computed once


def sharded(changes=(), replace: str | None = None):
    """The solution's ShardedAdamW, run in a fresh __main__ (it travels to the ranks by value),
    with `changes`: (old, new) replacements of a text found once in its cell; or `replace`, a
    learner's whole cell."""
    source = cell_by_grade_id(SOLUTION, "sharded_adamw").source if replace is None else replace
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} is not once in the cell: update this test"
        source = source.replace(old, new)
    module = types.ModuleType("__main__")
    for code in (cell_by_grade_id(SOLUTION, "imports").source, source):
        exec(compile(code, CELL_FILE, "exec"), module.__dict__)
    return module.ShardedAdamW


def fails(optimizer_class, want, match: str, world_size: int = 2) -> None:
    with pytest.raises(AssertionError) as error:
        check_sharded_adamw(optimizer_class, world_size=world_size, want=want)
    assert re.search(match, str(error.value), re.S), str(error.value)


def test_the_solution_passes_the_visible_and_the_hidden_tests(want):
    for world_size in (2, 3):
        check_sharded_adamw(sharded(), world_size=world_size, want=want)


REDUCE_TO_OWNERS = '''
class ShardedAdamW:
    """Whole tensors dealt out by turn; each gradient reduced to its owner, each parameter
    broadcast from it."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)
        world_size, rank = dist.get_world_size(), dist.get_rank()
        self.owner = [i % world_size for i in range(len(self.params))]
        mine = [p for p, o in zip(self.params, self.owner) if o == rank]
        self.inner = torch.optim.AdamW(mine, lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay) if mine else None

    @torch.no_grad()
    def step(self):
        for p, owner in zip(self.params, self.owner):
            dist.REDUCE_GRADIENT
            p.grad /= dist.get_world_size()
        if self.inner is not None:
            self.inner.step()
        for p, owner in zip(self.params, self.owner):
            dist.broadcast(p, src=owner)
'''
TO_OWNERS = "reduce(p.grad, dst=owner)"
ALL_REDUCE_AND_BROADCASTS = REDUCE_TO_OWNERS.replace("REDUCE_GRADIENT", "all_reduce(p.grad)")
REDUCE_TO_OWNERS = REDUCE_TO_OWNERS.replace("REDUCE_GRADIENT", TO_OWNERS)


def test_a_reduce_to_each_owner_and_a_broadcast_from_it_pass_too(want):
    check_sharded_adamw(sharded(replace=REDUCE_TO_OWNERS), world_size=3, want=want)


FULL_STATE = '''
class ShardedAdamW:
    """DDP's AdamW: the mean gradient everywhere, every rank stepping every parameter."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params = list(params)
        self.inner = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps,
                                       weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.inner.step()
'''

BORROWED = '''
from gpulab.distributed.zero import ZeroOneOptimizer


class ShardedAdamW:
    def __init__(self, params, **kwargs):
        self.inner = ZeroOneOptimizer(params, torch.optim.AdamW, **kwargs)

    def step(self):
        self.inner.reduce_gradients()
        self.inner.step()
'''

REDUCE = ("        dist.reduce_scatter_tensor(mine, grads)  # the sum over the ranks, of this "
          "slice only\n        self.shard.grad = mine.div_(world_size)  # the mean: DDP's "
          "gradient\n")
GATHER = "        dist.all_gather_into_tensor(whole, self.shard.detach())\n"
OWN_SLICE = "rank * self.size:(rank + 1) * self.size"
WRONG = {
    "full_state_on_every_rank": (
        {"replace": FULL_STATE},
        r"the right parameters, but rank 0 keeps 4544 bytes of tensors between steps, where "
        r"DDP's AdamW keeps 4544 on every rank and a sharded one at most 3600 here.*That is "
        r"the whole model's state on every rank"),
    "each_shard_with_its_own_rank_gradient": (
        {"changes": [(REDUCE, "        rank = dist.get_rank()\n        self.shard.grad = "
                              "grads[rank * self.size:(rank + 1) * self.size].clone()\n")]},
        r"after step 0, the parameters differ from DDP's .*each shard moved by its owner's "
        r"gradient alone, the shards out of step"),
    "no_gather": (
        {"changes": [(GATHER, "        rank = dist.get_rank()\n        whole = torch.cat("
                              "[p.detach().reshape(-1) for p in self.params])\n        whole = "
                              "F.pad(whole, (0, padding))\n        whole[rank * self.size:"
                              "(rank + 1) * self.size] = self.shard.detach()\n")]},
        r"after step 0, rank 1 and rank 0 hold different parameters .*step\(\) gathered "
        r"nothing: each rank updated its own shard"),
    "gathers_by_all_reduce": (
        {"changes": [(GATHER, "        rank = dist.get_rank()\n        whole.zero_()\n"
                              "        whole[rank * self.size:(rank + 1) * self.size] = "
                              "self.shard.detach()\n        dist.all_reduce(whole)\n")]},
        r"the right parameters, but step 0 on rank 0 made reduce_scatter_tensor of 2264 bytes, "
        r"all_reduce of 2264 bytes: a rank sends 3396 bytes in a ring, where DDP's all-reduce "
        r"of the gradients sends 2308.*An all-reduce sends twice what a reduce-scatter does"),
    "all_reduce_then_broadcasts": (
        {"replace": ALL_REDUCE_AND_BROADCASTS, "world_size": 3},  # 2: too uneven, first
        r"the right parameters, but step 0 on rank 0 made all_reduce of 2260 bytes, broadcast "
        r"of 2260 bytes: a rank sends 4520 bytes in a ring, where DDP's all-reduce of the "
        r"gradients sends 3109.*An all-reduce sends twice what a reduce-scatter does"),
    "whole_buffer_kept": (
        {"changes": [("        whole = torch.empty(self.size * world_size)  # made here: not "
                      "kept between steps\n", "        self.whole = whole = torch.empty("
                      "self.size * world_size)\n")]},
        r"rank 0 keeps 5664 bytes.*One tensor kept is as large as the whole model\. The "
        r"largest: ShardedAdamW.whole \(566 elements, 2264 "
        r"bytes\).*make whole-model buffers inside step\(\), not on self"),
    "state_started_afresh_each_step": (
        {"changes": [("        self.inner.step()\n", "        self.inner.state.clear()  # "
                      "forgets exp_avg, exp_avg_sq and the step count\n        "
                      "self.inner.step()\n")]},
        r"after step 1, the parameters differ from DDP's .*though step 0 agreed: what your "
        r"shard carries from step to step is off"),
    "borrows_gpulabs_zero": (
        {"replace": BORROWED},
        r"ShardedAdamW \(.*\) used gpulab's own code \(zero\.py: .*\) on rank 0: write the "
        r"sharding yourself"),
}


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_sharded_optimizer_fails_with_its_message(want, name):
    how, match = dict(WRONG[name][0]), WRONG[name][1]
    world_size = how.pop("world_size", 2)
    fails(sharded(**how), want, match, world_size)


def test_whole_tensors_dealt_out_by_turn_are_too_uneven_on_2_ranks(want):
    """The same design that passes on 3 ranks: on 2, rank 0 gets 528 of the 565 elements' state."""
    fails(sharded(replace=REDUCE_TO_OWNERS), want,
          r"rank 0 keeps 4236 bytes of tensors between steps.*at most 3600 here.*That is more "
          r"than one rank's share: the shares are uneven")


def test_a_subclass_of_torchs_zero_is_refused_before_any_rank_starts(want):
    subclass = sharded(replace="from torch.distributed.optim import ZeroRedundancyOptimizer\n"
                               "class ShardedAdamW(ZeroRedundancyOptimizer):\n    pass\n")
    fails(subclass, want, r"extends torch's ZeroRedundancyOptimizer")

