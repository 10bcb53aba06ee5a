"""torch.distributed from a notebook: launch ranks, collectives, their cost.

    from gpulab.distributed import run_on_ranks
    run_on_ranks(fn, 2)          # fn(rank, world_size) on 2 processes, values in rank order

Every name below is imported from its module on first use: `import gpulab.distributed` imports
neither torch nor any of these modules.

runtime/         how ranks start, run, report and stop: run_on_ranks / Launcher, torchrun_script,
                 LocalCluster and its ClusterResult, RankError, LaunchTimeout,
                 ProcessGroupStartError, Notice (a preemption notice) and Preempted, the fork
                 servers (its own map is in runtime/__init__.py)
collectives.py   what each collective does (pictures), ring and tree all-reduce from send/recv
allreduce.py     ring_all_reduce, tree_all_reduce: the reference all-reduces
cost_model.py    the alpha-beta model, algbw/busbw as nccl-tests reports them, fitting
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
cluster_train.py TRAIN_SCRIPT: DDP training that checkpoints, resumes, survives a killed worker
job_templates.py JobSpec, rendered as a SLURM sbatch script and a Kubeflow PyTorchJob
cloud_templates.py  the same JobSpec as a Dockerfile, a `docker run` line, a Vertex AI CustomJob
                 and GCE VMs in Terraform

Of these, only collectives.py and zero.py launch ranks (their demonstrations), and only they
import runtime.

Taught in: lessons/04_distributed_fundamentals.ipynb (launch, collectives, cost model),
lessons/05_multi_gpu_strategies.ipynb (data_parallel, zero) and
lessons/06_model_pipeline_tensor_parallelism.ipynb (groups, schedules, pipeline, tensor
parallelism, cluster and job templates)
"""

from gpulab.distributed.runtime import MODULES as RUNTIME_MODULES
from gpulab.faces import lazy_face, names_of

MODULES = {  # module -> the public names it gives this face
    "gpulab.distributed.allreduce": ("ring_all_reduce", "tree_all_reduce"),
    "gpulab.distributed.cloud_templates": ("render_docker_run", "render_dockerfile",
                                           "render_gce_terraform", "render_vertex_job",
                                           "vertex_job"),
    "gpulab.distributed.cluster_train": ("TRAIN_SCRIPT",),
    "gpulab.distributed.data_parallel": ("BucketedDDP", "NaiveDDP", "OverlappedDDP", "SyncStats",
                                         "assign_buckets"),
    "gpulab.distributed.groups": ("GridCoords", "ParallelGroups", "RankGrid", "device_mesh",
                                  "new_groups"),
    "gpulab.distributed.job_templates": ("JobSpec", "pytorchjob", "render_pytorchjob",
                                         "render_sbatch"),
    "gpulab.distributed.pipeline": ("ActionTiming", "GPTStage", "PipelineResult",
                                    "PipelineStage", "measured_schedule", "run_pipeline",
                                    "split_gpt", "stage_layers"),
    "gpulab.distributed.pipeline_torch": ("TorchPipeline", "torch_pipeline"),
    "gpulab.distributed.schedule": ("Action", "Schedule", "bubble_fraction_theory",
                                    "bubble_ratio_theory", "gpipe_order", "interleaved_order",
                                    "one_f_one_b_order", "schedule_1f1b", "schedule_gpipe",
                                    "schedule_interleaved_1f1b", "simulate_schedule"),
    "gpulab.distributed.schedule_draw": ("draw_schedule",),
    "gpulab.distributed.schedule_rules": ("ScheduleError", "check_schedule"),
    "gpulab.distributed.tensor_parallel": ("ColumnParallelLinear", "RowParallelLinear",
                                           "copy_to_tp", "gather_from_sequence",
                                           "gather_from_tp", "reduce_from_tp",
                                           "reduce_scatter_to_sequence", "scatter_to_sequence",
                                           "split_to_tp", "sync_sequence_parallel_grads"),
    "gpulab.distributed.tp_dtensor": ("block_tp_plan", "parallelize_block"),
    "gpulab.distributed.tp_transformer": ("LayerComm", "TPBlock", "TPCausalSelfAttention",
                                          "TPFeedForward", "apply_tensor_parallel",
                                          "count_collectives", "tp_block_from", "tp_layer_comm"),
    "gpulab.distributed.zero": ("MemoryRow", "StrategyComparison", "ZeroOneOptimizer",
                                "compare_strategies", "format_memory_table", "memory_per_rank",
                                "optimizer_state_bytes", "partition_parameters", "rank_memory",
                                "zero_memory_table"),
    **RUNTIME_MODULES,  # the launch faces: run_on_ranks, LocalCluster, their results and errors
}
__getattr__, __dir__ = lazy_face(__name__, MODULES)
__all__ = names_of(MODULES)
