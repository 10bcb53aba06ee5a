"""Lab 5, parallelism across nodes (solutions/lab5_parallelism_across_nodes/...): its parts and
points, and its checkers. The tensor-parallel parts run on gloo ranks (shared.py, ranks.py); the
fourth on a 2-node local cluster (pp_tp_cluster.py, cluster_rank.py, cluster_grade.py).

    check_tp_linear(CopyToTP, ReduceFromTP, ...)   Part 1  tensor-parallel layers
    check_tp_mlp(TPMLP)                            Part 2  a Megatron MLP
    check_one_f_one_b(one_f_one_b_stage)           Part 3  the 1F1B schedule
    check_pp_tp_cluster(pp_tp_step, ...)           Part 4  pp x tp GPT on two nodes
    check_cloud_job(cloud_job)                     Part 5  the same job on spot cloud GPUs
    check_sp_block(SPBlock)                        Part 6  attention by heads, sequence parallel
    check_interleaved(interleaved_stage)           Part 7  a schedule of 2 chunks per device

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (Part 5: its section 12, and
lessons/01's cost of a run)
"""

from gpulab.checks.lab5.cloud_job import check_cloud_job, limits
from gpulab.checks.lab5.interleaved import check_interleaved
from gpulab.checks.lab5.one_f_one_b import check_one_f_one_b
from gpulab.checks.lab5.pp_tp_cluster import check_pp_tp_cluster
from gpulab.checks.lab5.sp_block import check_sp_block
from gpulab.checks.lab5.tp_linear import check_tp_linear
from gpulab.checks.lab5.tp_mlp import check_tp_mlp
from gpulab.checks.table import Assignment, Check, part

TP_LAYERS = ("CopyToTP", "ReduceFromTP", "ColumnParallelLinear", "RowParallelLinear")

ASSIGNMENT = Assignment("lab5_parallelism_across_nodes", (
    part("tp_linear", 4, Check("check_tp_linear", TP_LAYERS, {"tp": 2})),
    part("tp_mlp", 3, Check("check_tp_mlp", ("TPMLP",), {"tp": 2})),
    part("one_f_one_b", 4,
         Check("check_one_f_one_b", ("one_f_one_b_stage",), {"p": 4, "m": 8}),
         Check("check_one_f_one_b", ("one_f_one_b_stage",), {"p": 2, "m": 3})),
    part("pp_tp_cluster", 5, Check(
        "check_pp_tp_cluster", ("pp_tp_step", "TPMLP", *TP_LAYERS, "one_f_one_b_stage"),
        {"nodes": 2, "procs_per_node": 2, "n_microbatches": 4})),
    part("cloud_job", 3, Check("check_cloud_job", ("cloud_job",), {})),
    part("sp_block", 4, Check("check_sp_block", ("SPBlock",), {"tp": 2})),
    part("interleaved", 3,
         Check("check_interleaved", ("interleaved_stage",), {"p": 4, "m": 8}),
         Check("check_interleaved", ("interleaved_stage",), {"p": 2, "m": 4, "on_ranks": True})),
))
ANSWERS = {"cloud_job": lambda: limits()}  # the scenario's limits, the same for every learner

__all__ = ["ANSWERS", "ASSIGNMENT", "check_cloud_job", "check_interleaved", "check_one_f_one_b",
           "check_pp_tp_cluster", "check_sp_block", "check_tp_linear", "check_tp_mlp"]
