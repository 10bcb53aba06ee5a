"""Lab 5, parallelism across nodes (solutions/lab5_parallelism_across_nodes/...): its parts and
points, and its checkers. The tensor-parallel parts run on gloo ranks (shared.py, ranks.py); the
last part on a 2-node local cluster (pp_tp_cluster.py, cluster_rank.py, cluster_grade.py).

    check_tp_linear(CopyToTP, ReduceFromTP, ...)   Part 1  tensor-parallel layers
    check_tp_mlp(TPMLP)                            Part 2  a Megatron MLP
    check_one_f_one_b(one_f_one_b_stage)           Part 3  the 1F1B schedule
    check_pp_tp_cluster(pp_tp_step, ...)           Part 4  pp x tp GPT on two nodes

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from gpulab.checks.lab5.one_f_one_b import check_one_f_one_b
from gpulab.checks.lab5.pp_tp_cluster import check_pp_tp_cluster
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
))
ANSWERS = {}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_one_f_one_b", "check_pp_tp_cluster",
           "check_tp_linear", "check_tp_mlp"]
