"""GPU memory: estimate it on paper, measure it, run under a budget, diagnose an OOM.

    from gpulab.memory import estimate_memory, measure_step
    est = estimate_memory(model, batch_size=64, precision=gpulab.runner.autocast)
    m = measure_step(model, (x, y), torch.optim.Adam(model.parameters()),
                     amp=gpulab.runner.autocast)
    m.error_of(est)                                  # within 5% on the course's models
    with memory_budget(64 * 2**20, model=model, optimizer=opt):
        ...                                          # torch.OutOfMemoryError past 64 MiB

breakdown      MemoryBreakdown: bytes per category (parameters, gradients, optimizer,
               activations, temporary, other), as a table and a bar chart
recipes        bytes per parameter by precision recipe and optimizer; ZeRO model states
paper_models   what each layer of the course's models saves for backward
timeline       PaperStep: a training step replayed on paper, tensor by tensor
estimate       estimate_memory, estimate_transformer -> MemoryEstimate (napkin sum and peak)
tracker        MemoryTracker: live tensor storages by category, the peak, a budget
measure        measure_step -> Measurement (CPU: the tracker; CUDA: the allocator's peak)
budget         memory_budget: the real CUDA OOM, or the same error type simulated on the CPU
oom            explain_oom, find_max_batch, make_training_step
checkpointing  checkpoint_blocks (torch.utils.checkpoint per Block), checkpointing_tradeoff
allocator      allocator_state: the CUDA caching allocator's allocated vs reserved (GPU only)
oom_scenario   OOMScenario: Lab 4's GPT step that does not fit its budget, as a value
Taught in: lessons/07_gpu_memory.ipynb; Lab 4 ("Fix the OOM")
"""

from gpulab.memory.allocator import AllocatorState, allocator_state
from gpulab.memory.breakdown import CATEGORIES, MemoryBreakdown, format_bytes, plot_breakdowns
from gpulab.memory.budget import memory_budget
from gpulab.memory.checkpointing import (
    CheckpointTradeoff,
    checkpoint_blocks,
    checkpointing_tradeoff,
    is_checkpointed,
    uncheckpoint_blocks,
)
from gpulab.memory.estimate import MemoryEstimate, estimate_memory, estimate_transformer
from gpulab.memory.measure import Measurement, measure_step, training_step
from gpulab.memory.oom import (
    BatchSearch,
    OOMReport,
    explain_oom,
    find_max_batch,
    free_memory,
    make_training_step,
)
from gpulab.memory.oom_scenario import BudgetRun, OOMScenario, oom_scenario
from gpulab.memory.recipes import RECIPES, bytes_per_parameter, model_states, transformer_params
from gpulab.memory.timeline import PaperStep
from gpulab.memory.tracker import MemoryTracker, OOMRecord, plot_timeline

__all__ = [
    "CATEGORIES", "RECIPES", "AllocatorState", "BatchSearch", "CheckpointTradeoff",
    "Measurement", "MemoryBreakdown", "MemoryEstimate", "MemoryTracker", "OOMRecord",
    "OOMReport", "PaperStep", "allocator_state", "bytes_per_parameter", "checkpoint_blocks",
    "checkpointing_tradeoff", "estimate_memory", "estimate_transformer", "explain_oom",
    "find_max_batch", "format_bytes", "free_memory", "is_checkpointed", "make_training_step",
    "measure_step", "memory_budget", "model_states", "plot_breakdowns", "plot_timeline",
    "training_step",
    "transformer_params", "uncheckpoint_blocks",
    "BudgetRun", "OOMScenario", "oom_scenario",
]
