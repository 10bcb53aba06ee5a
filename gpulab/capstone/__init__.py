"""The capstone: distributed training of a GPT, end to end (lessons 03-08 put together).

    config = capstone_config()                       # "tiny" on the cpu runner, "gpt-400m" on gpu
    plan = ParallelPlan(dp_size=4, precision="bf16", budget_bytes=32 * 2**20)
    run = run_capstone(shard_model, save_checkpoint, load_checkpoint, plan=plan, config=config,
                       checkpoint_dir="ckpt", kill_at_step=6, max_restarts=1)
    reference_losses(config, steps=6)                # the same steps in one process

config     CapstoneConfig and its presets, sized by the runner
data       each step's token batch, a function of (seed, step); each rank's microbatches
plan       ParallelPlan (dp_size x tp_size, precision, checkpointing, accumulation, budget),
           make_mesh: the ("dp", "tp") DeviceMesh
train      the loop every rank runs around the learner's shard_model and checkpoint functions
launch     run_capstone: the learner's code as a script on a LocalCluster -> CapstoneRun
measure    PeakMeter (FSDPMemTracker on CPU, the allocator on CUDA), describe_model
profile    profile_step: a step's compute, communication and idle time
reference  reference_losses: the same training in one process, without any parallelism
preemption what the loop watches when a notice may come: every save, the state a resume loaded
hang       a hang planted on purpose (one rank skips one collective), drawn per learner
Taught in: solutions/capstone_distributed_gpt (the capstone project)
"""

from gpulab.capstone.config import PRESETS, CapstoneConfig, capstone_config
from gpulab.capstone.data import rank_batch, token_batch
from gpulab.capstone.launch import CapstoneRun, run_capstone
from gpulab.capstone.plan import ParallelPlan, make_mesh
from gpulab.capstone.reference import reference_losses

__all__ = ["PRESETS", "CapstoneConfig", "CapstoneRun", "ParallelPlan", "capstone_config",
           "make_mesh", "rank_batch", "reference_losses", "run_capstone", "token_batch"]
