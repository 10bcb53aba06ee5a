"""The checkers that lab test cells call. Each one runs the learner's code itself, compares plain
NumPy results with a reference, and fails with an AssertionError that teaches: which case, what
came out against what was expected, and the likely cause.

    from gpulab.checks import check_block_sum
    check_block_sum(block_sum, sizes=[256, 1000])

common.py   shared by every lab: "is this the learner's own code", launching, reading results
lab1.py     Lab 1, CUDA kernels
training.py shared by the training labs: tiny problems, one-thread runs, bf16 tolerances
lab2.py     Lab 2, from CPU to GPU training with AMP (Parts 1-3; lab2_resume.py: Parts 4-5)
lab3.py     Lab 3, DDP from the ground up: Part 1, and running code on ranks (lab3_ddp.py: Part 2;
            lab3_buckets.py: Part 3; lab3_train.py: Part 4; on each rank: lab3_ranks.py,
            lab3_record.py)
lab4.py     Lab 4, memory and profiling: Part A, fix the OOM
lab4_pipeline.py  Lab 4, Part B: speed up a slow training pipeline (lab4_speed.py: the speed-up)
lab5.py     Lab 5, parallelism across nodes: Part 1, tensor-parallel layers (lab5_mlp.py: Part 2;
            lab5_schedule.py: Part 3; shared: lab5_shared.py; on each rank: lab5_ranks.py)
lab5_cluster.py  Lab 5, Part 4: pp x tp GPT on a 2-node local cluster (the script each node
            runs: lab5_cluster_script.py; on each rank: lab5_cluster_rank.py; lab5_cluster_grade.py)
"""

from gpulab.checks.lab1 import (
    check_block_sum,
    check_block_sum_races,
    check_histogram,
    check_histogram_races,
    check_matmul_tiled,
    check_matmul_tiled_races,
    check_saxpy,
    check_transpose,
    check_waves,
)
from gpulab.checks.lab2 import check_accumulate_gradients, check_amp_step, check_to_device
from gpulab.checks.lab2_resume import check_memorize, check_resume
from gpulab.checks.lab3 import check_ring_all_reduce
from gpulab.checks.lab3_buckets import check_fast_ddp, check_make_buckets
from gpulab.checks.lab3_ddp import check_simple_ddp
from gpulab.checks.lab3_train import check_train_ddp
from gpulab.checks.lab4 import check_diagnosis, check_fit_step
from gpulab.checks.lab4_pipeline import check_fast_results
from gpulab.checks.lab4_speed import check_speedup
from gpulab.checks.lab5 import check_tp_linear
from gpulab.checks.lab5_cluster import check_pp_tp_cluster
from gpulab.checks.lab5_mlp import check_tp_mlp
from gpulab.checks.lab5_schedule import check_one_f_one_b

__all__ = [
    "check_accumulate_gradients",
    "check_amp_step",
    "check_block_sum",
    "check_block_sum_races",
    "check_diagnosis",
    "check_fast_ddp",
    "check_fast_results",
    "check_fit_step",
    "check_histogram",
    "check_histogram_races",
    "check_make_buckets",
    "check_matmul_tiled",
    "check_matmul_tiled_races",
    "check_memorize",
    "check_one_f_one_b",
    "check_pp_tp_cluster",
    "check_resume",
    "check_ring_all_reduce",
    "check_saxpy",
    "check_simple_ddp",
    "check_speedup",
    "check_to_device",
    "check_tp_linear",
    "check_tp_mlp",
    "check_train_ddp",
    "check_transpose",
    "check_waves",
]
