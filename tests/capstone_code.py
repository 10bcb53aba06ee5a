"""The capstone's learner functions, written as a learner would (the solution notebook holds the
same code), and known-wrong versions of each, for the tests of gpulab.capstone and its checkers.
Each wrong version is a mistake a learner makes; its docstring says which.
"""

from __future__ import annotations

import signal
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpulab.distributed import REQUEUE_EXIT_CODE
from gpulab.distributed.tp_dtensor import block_tp_plan
from gpulab.memory import checkpoint_blocks, estimate_transformer, model_states


def shard_model(model, mesh, plan):
    """TP inside the node (optional), checkpointing, then FSDP2 per Block and at the root."""
    from torch.distributed.tensor.parallel import parallelize_module

    if plan.tp_size > 1:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], block_tp_plan())
    if plan.activation_checkpointing:
        checkpoint_blocks(model)
    policy = MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:  # each Block its own all-gather unit
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    return model


def save_checkpoint(folder, model, optimizer, step):
    """A DCP checkpoint per save, in its own folder: a kill mid-save leaves the last one whole."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state},
             checkpoint_id=Path(folder) / f"step_{step:06d}")


def load_checkpoint(folder, model, optimizer):
    """Resume from the newest complete checkpoint (DCP writes .metadata last); 0 if none."""
    done = sorted(p for p in Path(folder).glob("step_*") if (p / ".metadata").exists())
    if not done:
        return 0
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=done[-1])
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return int(done[-1].name.removeprefix("step_"))


def predict_memory(config, plan):
    """Per-rank peak bytes: fp32 shards of weights and AdamW state (ZeRO-3), the gradient shard
    and a Block's reduce-scatter buffer while microbatches accumulate, one microbatch's
    activations in the gathered dtype, the root's gathered weights and two Blocks' worth of
    gathered weights (the running Block and its all-gather buffer)."""
    states = model_states(config.n_params, "fp32", "adamw", zero_stage=3,
                          world_size=plan.dp_size)
    dtype = {"bf16": "bf16", "fp16": "bf16", "fp32": "fp32"}[plan.precision]
    step = estimate_transformer(config.n_layer, config.n_embd, config.n_head, config.seq_len,
                                plan.micro_batch_size(config), vocab_size=config.vocab_size,
                                optimizer="adamw", precision=dtype, device_type="cpu",
                                checkpointing=plan.activation_checkpointing)
    itemsize = 4 if plan.precision == "fp32" else 2
    C = config.n_embd
    block = (12 * C * C + 13 * C) // plan.tp_size
    root = config.n_params - config.n_layer * (12 * C * C + 13 * C)
    gathered = (root + 2 * block) * itemsize
    # With accumulation the peak moves into backward: the gradient shard is already there, and
    # a Block's whole fp32 gradient waits in the reduce-scatter buffer.
    grads = states.grad_bytes + 4 * block if plan.grad_accum_steps > 1 else 0
    return (states.param_bytes + states.optimizer_state_bytes + grads
            + step.peak.activations + step.peak.temporary + gathered)


def install_notice_handler():
    """SIGTERM's handler only notes the notice: a save from inside it could interleave its
    collectives with the one the step has in flight."""
    global notice_came
    notice_came = False

    def on_notice(signum, frame):
        global notice_came
        notice_came = True

    signal.signal(signal.SIGTERM, on_notice)


def handle_notice(folder, model, optimizer, step):
    """At a step boundary: one node was told, so the ranks agree first (a MAX all-reduce of
    the flag); then every rank saves the steps done and the job asks to be requeued."""
    told = torch.tensor([1.0 if notice_came else 0.0])
    dist.all_reduce(told, op=dist.ReduceOp.MAX)
    if told.item():
        save_checkpoint(folder, model, optimizer, step)
        raise SystemExit(REQUEUE_EXIT_CODE)


# ----------------------------------------------------------------------------- known-wrong


def shard_root_only(model, mesh, plan):
    """One fully_shard at the root: every weight is gathered for the whole forward."""
    policy = MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=torch.float32)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    return model


def predict_unsharded(config, plan):
    """Forgets that FSDP2 shards the model states: one device's whole step."""
    return estimate_transformer(config.n_layer, config.n_embd, config.n_head, config.seq_len,
                                plan.micro_batch_size(config), vocab_size=config.vocab_size,
                                optimizer="adamw", precision="bf16-autocast",
                                device_type="cpu").peak_bytes


def shard_model_stub(model, mesh, plan):
    """Apply the plan; return the model."""
    raise NotImplementedError()


# ----------------------------------------------------------------------------- the hang (Part 4)


def diagnose_hang(report):
    """The rank not waiting where the majority waits, and the majority's collective."""
    import re
    from collections import Counter

    waiting = {int(rank): name for rank, name in
               re.findall(r"^\s*rank (\d+): waiting in (\w+)", report, re.M)}
    finished = re.search(r"^Finished: (.*)$", report, re.M)
    done = [int(r) for r in re.findall(r"rank (\d+)", finished[1])] if finished else []
    missing = Counter(waiting.values()).most_common(1)[0][0]
    elsewhere = [r for r in sorted([*waiting, *done]) if waiting.get(r) != missing]
    return elsewhere[0], missing


def blame_first_rank(report):
    """Blames the first rank the report lists, and its collective."""
    import re

    rank, name = re.search(r"rank (\d+): waiting in (\w+)", report).groups()
    return int(rank), name


def blame_longest_wait(report):
    """Blames the rank that waited longest (a victim: it waits for the one that skipped)."""
    import re

    waits = re.findall(r"rank (\d+): waiting in (\w+) .* for ([\d.]+) s", report)
    rank, name, _ = max(waits, key=lambda w: float(w[2]))
    return int(rank), name


def blame_where_the_skipper_waits(report):
    """The right rank, but the collective it waits in, not the one it skipped."""
    rank, _ = diagnose_hang(report)
    import re

    found = re.search(rf"rank {rank}: waiting in (\w+)", report)
    return rank, found[1] if found else "nothing"


def diagnose_hang_stub(report):
    """(rank, collective)."""
    raise NotImplementedError()
