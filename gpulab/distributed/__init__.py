"""torch.distributed from a notebook: launch ranks, collectives, their cost.

    from gpulab.distributed import run_on_ranks
    run_on_ranks(fn, 2)          # fn(rank, world_size) on 2 processes, values in rank order

launch.py        run_on_ranks / Launcher: a notebook-defined function on N processes
torchrun.py      torchrun_script: a script written from a cell, under torchrun
collectives.py   what each collective does (pictures), ring and tree all-reduce from send/recv
cost_model.py    the alpha-beta model, algbw/busbw as nccl-tests reports them, fitting
errors.py        RankError, LaunchTimeout, ProcessGroupStartError
data_parallel.py NaiveDDP, BucketedDDP, OverlappedDDP: DDP from scratch (buckets, overlap, no_sync)
zero.py          ZeroOneOptimizer (ZeRO-1), bytes per rank, the ZeRO paper's table, vs FSDP2
groups.py        RankGrid: the (dp, pp, tp) rank layout (Megatron's), new_groups, device_mesh
schedule.py      GPipe, 1F1B and interleaved 1F1B laid out in time: bubble, activations in flight
schedule_rules.py  check_schedule: a pipeline order against the rules, with messages that teach
schedule_draw.py draw_schedule: the picture of a schedule
tensor_parallel.py  Megatron-LM's f/g ops (and sequence parallelism's g, g-bar), Column- and
                 RowParallelLinear, built from an nn.Linear
tp_transformer.py   TPBlock: MLP and attention (by heads) split over TP ranks, optionally
                 sequence-parallel; tp_block_from, apply_tensor_parallel, tp_layer_comm (bytes)
tp_dtensor.py    the same Block through DTensor: block_tp_plan, parallelize_block
pipeline_split.py  split_gpt: a GPT as stages (embedding + Blocks, Blocks, Blocks + head), GPTStage
pipeline.py      PipelineStage, run_pipeline: any schedule order (GPipe, 1F1B) run for real over
                 isend/irecv; PipelineResult (losses, timings, peak held), measured_schedule
pipeline_torch.py  torch_pipeline: the same through torch.distributed.pipelining (ScheduleGPipe,
                 Schedule1F1B)
cluster.py       LocalCluster: N nodes x M processes on this machine, torchrun + c10d rendezvous,
                 each node in its own network namespace where allowed (netns.py); what a run
                 left behind: ClusterResult (cluster_result.py)
cluster_train.py TRAIN_SCRIPT: DDP training that checkpoints, resumes, survives a killed worker
job_templates.py JobSpec, rendered as a SLURM sbatch script and a Kubeflow PyTorchJob
cloud_templates.py  the same JobSpec as a Dockerfile, a `docker run` line, a Vertex AI CustomJob
                 and GCE VMs in Terraform

Taught in: lessons/04_distributed_fundamentals.ipynb (launch, collectives, cost model),
lessons/05_multi_gpu_strategies.ipynb (data_parallel, zero) and
lessons/06_model_pipeline_tensor_parallelism.ipynb (groups, schedules, pipeline, tensor
parallelism, cluster and job templates)
"""

from gpulab.distributed.allreduce import ring_all_reduce, tree_all_reduce
from gpulab.distributed.cloud_templates import (
    render_docker_run,
    render_dockerfile,
    render_gce_terraform,
    render_vertex_job,
    vertex_job,
)
from gpulab.distributed.cluster_train import TRAIN_SCRIPT
from gpulab.distributed.data_parallel import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    SyncStats,
    assign_buckets,
)
from gpulab.distributed.groups import (
    GridCoords,
    ParallelGroups,
    RankGrid,
    device_mesh,
    new_groups,
)
from gpulab.distributed.job_templates import JobSpec, pytorchjob, render_pytorchjob, render_sbatch
from gpulab.distributed.pipeline import (
    ActionTiming,
    GPTStage,
    PipelineResult,
    PipelineStage,
    measured_schedule,
    run_pipeline,
    split_gpt,
    stage_layers,
)
from gpulab.distributed.pipeline_torch import TorchPipeline, torch_pipeline
from gpulab.distributed.runtime.cluster import ClusterResult, LocalCluster, NodeResult
from gpulab.distributed.runtime.errors import (
    LaunchError,
    LaunchTimeout,
    ProcessGroupStartError,
    RankError,
)
from gpulab.distributed.runtime.launch import Launcher, run_on_ranks
from gpulab.distributed.runtime.netns import InterfaceBytes, NetnsError
from gpulab.distributed.runtime.torchrun import TorchrunResult, torchrun_script
from gpulab.distributed.schedule import (
    Action,
    Schedule,
    bubble_fraction_theory,
    bubble_ratio_theory,
    gpipe_order,
    interleaved_order,
    one_f_one_b_order,
    schedule_1f1b,
    schedule_gpipe,
    schedule_interleaved_1f1b,
    simulate_schedule,
)
from gpulab.distributed.schedule_draw import draw_schedule
from gpulab.distributed.schedule_rules import ScheduleError, check_schedule
from gpulab.distributed.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    copy_to_tp,
    gather_from_sequence,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
    split_to_tp,
    sync_sequence_parallel_grads,
)
from gpulab.distributed.tp_dtensor import block_tp_plan, parallelize_block
from gpulab.distributed.tp_transformer import (
    LayerComm,
    TPBlock,
    TPCausalSelfAttention,
    TPFeedForward,
    apply_tensor_parallel,
    count_collectives,
    tp_block_from,
    tp_layer_comm,
)
from gpulab.distributed.zero import (
    MemoryRow,
    StrategyComparison,
    ZeroOneOptimizer,
    compare_strategies,
    format_memory_table,
    memory_per_rank,
    optimizer_state_bytes,
    partition_parameters,
    rank_memory,
    zero_memory_table,
)

__all__ = [
    "BucketedDDP", "Launcher", "LaunchError", "LaunchTimeout", "MemoryRow", "NaiveDDP",
    "OverlappedDDP", "ProcessGroupStartError", "RankError", "StrategyComparison", "SyncStats",
    "TorchrunResult", "ZeroOneOptimizer", "assign_buckets", "compare_strategies",
    "format_memory_table", "memory_per_rank", "optimizer_state_bytes", "partition_parameters",
    "rank_memory", "ring_all_reduce", "run_on_ranks", "torchrun_script", "tree_all_reduce",
    "zero_memory_table",
    "Action", "GridCoords", "ParallelGroups", "RankGrid", "Schedule", "ScheduleError",
    "bubble_fraction_theory", "bubble_ratio_theory", "check_schedule", "device_mesh",
    "draw_schedule", "gpipe_order", "interleaved_order", "new_groups", "one_f_one_b_order",
    "schedule_1f1b", "schedule_gpipe", "schedule_interleaved_1f1b", "simulate_schedule",
    "ColumnParallelLinear", "LayerComm", "RowParallelLinear", "TPBlock", "TPCausalSelfAttention",
    "TPFeedForward", "apply_tensor_parallel", "block_tp_plan", "copy_to_tp", "count_collectives",
    "gather_from_sequence", "gather_from_tp", "parallelize_block", "reduce_from_tp",
    "reduce_scatter_to_sequence", "scatter_to_sequence", "split_to_tp",
    "sync_sequence_parallel_grads", "tp_block_from", "tp_layer_comm",
    "ActionTiming", "GPTStage", "PipelineResult", "PipelineStage", "TorchPipeline",
    "measured_schedule", "run_pipeline", "split_gpt", "stage_layers", "torch_pipeline",
    "ClusterResult", "InterfaceBytes", "JobSpec", "LocalCluster", "NetnsError", "NodeResult",
    "TRAIN_SCRIPT", "pytorchjob", "render_pytorchjob", "render_sbatch",
    "render_docker_run", "render_dockerfile", "render_gce_terraform", "render_vertex_job",
    "vertex_job",
]
