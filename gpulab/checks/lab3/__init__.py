"""Lab 3, DDP from the ground up (solutions/lab3_ddp_from_scratch/lab3_ddp_from_scratch.ipynb): its
parts and points, and its checkers. Each runs the learner's code on real gloo processes
(harness/ranks.py); what runs on each rank is ranks.py, shipped there by value.

    check_ring_all_reduce(ring_all_reduce)   Part 1  ring all-reduce from point-to-point messages
    check_simple_ddp(SimpleDDP)              Part 2  broadcast at start, averaged gradients
    check_fast_ddp(FastDDP, make_buckets)    Part 3  buckets, launched from gradient hooks
    check_train_ddp(train_ddp)               Part 4  DistributedSampler and the training loop
    check_sharded_adamw(ShardedAdamW)        Part 5  AdamW's state sharded over the ranks (ZeRO-1)

Taught in: lessons/04_distributed_fundamentals.ipynb, lessons/05_multi_gpu_strategies.ipynb
"""

from gpulab.checks.lab3.fast_ddp import check_fast_ddp, check_make_buckets
from gpulab.checks.lab3.ring import check_ring_all_reduce
from gpulab.checks.lab3.sharded_adamw import check_sharded_adamw, expected_sharded_adamw
from gpulab.checks.lab3.simple_ddp import check_simple_ddp
from gpulab.checks.lab3.train_ddp import check_train_ddp
from gpulab.checks.table import Answer, Assignment, Check, part

ASSIGNMENT = Assignment("lab3_ddp_from_scratch", (
    part("ring_all_reduce", 6, Check("check_ring_all_reduce", ("ring_all_reduce",),
                                     {"world_sizes": (2, 3), "sizes": (7, 1000)})),
    part("simple_ddp", 3, Check("check_simple_ddp", ("SimpleDDP",), {"world_sizes": (2,)})),
    part("fast_ddp", 7, Check("check_fast_ddp", ("FastDDP", "make_buckets"),
                              {"world_size": 2})),
    part("train_ddp", 4, Check("check_train_ddp", ("train_ddp",), {"world_sizes": (2, 4)})),
    part("sharded_adamw", 5, Check("check_sharded_adamw", ("ShardedAdamW",),
                                   {"world_size": 2, "want": Answer("lab3.sharded_adamw")})),
))
# DDP's parameters and state bytes, computed by the grader outside the learner's kernel.
ANSWERS = {"sharded_adamw": expected_sharded_adamw}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_fast_ddp", "check_make_buckets",
           "check_ring_all_reduce", "check_sharded_adamw", "check_simple_ddp",
           "check_train_ddp"]
