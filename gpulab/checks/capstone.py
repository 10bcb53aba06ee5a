"""Checkers for the capstone (solutions/capstone_distributed_gpt/...): the learner's FSDP2
sharding, memory prediction and distributed checkpoints, each run by gpulab's training loop on a
2-node x 2-process LocalCluster (gpulab.capstone.launch) and compared with references computed
here, never with what the notebook claims.

    check_sharded_training(shard_model, plan)                     # losses vs one process
    check_memory_plan(predict_memory, shard_model, plan)          # budget, prediction within 10%
    check_prediction_follows_plan(predict_memory, plan)           # no launch: reads the plan
    check_elastic_resume(shard_model, save_checkpoint, load_checkpoint, plan)   # kill, resume

Each check is one launch (10-40 s on 2 busy cores). A function still holding the release's
`raise NotImplementedError()` is refused before any launch.
Taught in: the capstone, which puts lessons 03-08 together
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gpulab.capstone import ParallelPlan, capstone_config, reference_losses, run_capstone
from gpulab.checks.lab3 import learner_frames
from gpulab.checks.lab5_cluster_script import SourceNotFound
from gpulab.checks.training import _require_own_function
from gpulab.memory import format_bytes
from gpulab.self_check.stubs import STUB_HINT
from gpulab.self_check.stubs import is_stub_function as is_stub

NODES, PROCS_PER_NODE = 2, 2
PREDICTION_TOLERANCE = 0.10  # |predicted / measured - 1|


def loss_tolerance() -> float:
    """How far a step's loss may be from the one-process fp32 reference: bf16 weights move the
    tiny GPT's loss by < 0.01 over its first steps (tests/test_capstone_units.py)."""
    import gpulab

    return gpulab.runner.pick(cpu=0.03, gpu=0.05)


def _require(fn, name: str) -> None:
    _require_own_function(fn, name)
    if is_stub(fn):
        raise AssertionError(f"{name} would have raised NotImplementedError on every rank: it "
                             f"is still the stub. {STUB_HINT}")


def _plan_for(plan, config) -> None:
    if not isinstance(plan, ParallelPlan):
        raise AssertionError(f"plan is a {type(plan).__name__}: make it a "
                             "gpulab.capstone.ParallelPlan(dp_size=..., ...)")
    try:
        plan.check(NODES * PROCS_PER_NODE, PROCS_PER_NODE, config)
    except ValueError as error:
        raise AssertionError(f"PLAN: {error}") from None


def _launch(what: str, graded: dict, plan, config, **options):
    try:
        run = run_capstone(graded["shard_model"], graded.get("save_checkpoint"),
                           graded.get("load_checkpoint"), plan=plan, config=config, **options)
    except SourceNotFound as error:
        raise AssertionError(f"{what}: {error}") from None
    if not run.ok:
        raise AssertionError(_failure_text(what, run))
    return run


def _failure_text(what: str, run) -> str:
    text = run.error
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no traceback"
    if "the cluster failed to start" in text:
        return (f"{what}: the cluster could not start its ranks (twice), before any of your "
                f"code ran: {last[:300]}\nThis is the machine, not your code: run it again.")
    stub = "NotImplementedError" in last
    out = [f"{what}: rank {run.failed_rank} {'raised NotImplementedError' if stub else 'failed'}"
           f" on the cluster: {last[:400]}"]
    frames = learner_frames(text)
    if frames:
        out.append(f"Where, in capstone_train.py (your code, as every rank runs it):\n{frames}")
    out.append(STUB_HINT if stub else "The lines above show where it failed; run_capstone(..., "
               "echo=True) in a cell of your own shows every rank's output.")
    return "\n".join(out)


# ----------------------------------------------------------------------------- training


def check_sharded_training(shard_model, plan, *, steps: int = 4, seed: int = 0,
                           isolation: str = "auto") -> None:
    """Train `steps` steps with shard_model(model, mesh, plan) on the 2x2 cluster and compare
    each step's loss with the same training in one process; check that shard_model sharded
    every Block and the root with FSDP2 in the plan's precision, as the plan says."""
    _require(shard_model, "shard_model")
    config = capstone_config(None, seed=seed)
    _plan_for(plan, config)
    run = _launch("check_sharded_training", {"shard_model": shard_model}, plan, config,
                  steps=steps, measure_step=None, isolation=isolation)
    _check_structure(run.ranks[0]["model"], plan)
    reference, tolerance = reference_losses(config, steps), loss_tolerance()
    print(f"step  cluster  one process   ({run.isolation}, {plan})")
    for step, (got, want) in enumerate(zip(run.losses, reference, strict=True)):
        print(f"{step:>4}  {got:7.4f}  {want:11.4f}")
    for step, (got, want) in enumerate(zip(run.losses, reference, strict=True)):
        if abs(got - want) > tolerance:
            hint = ("step 0 agrees, so the model starts right; later steps drift when the "
                    "ranks do not average their gradients over the data-parallel axis: "
                    "fully_shard on mesh['dp'] (the whole dp group), not mesh['tp'] or a "
                    "mesh of your own" if step else
                    "the very first loss differs: the model computes something else than the "
                    "one-process GPT (a layer replaced, a tensor-parallel plan that does not "
                    "match the Block's layers)")
            raise AssertionError(f"step {step}: the cluster's loss is {got:.4f}, the "
                                 f"one-process reference {want:.4f} (tolerance {tolerance}): "
                                 f"{hint}.")


def _check_structure(model: dict, plan) -> None:
    blocks = model["fsdp_blocks"]
    if not model["fsdp_root"]:
        raise AssertionError("shard_model returned a model that is not an FSDPModule: call "
                             "fully_shard(model, mesh=mesh['dp'], mp_policy=...) on the root "
                             "too, after the Blocks, and return that model.")
    if not all(blocks):
        missing = [i for i, ok in enumerate(blocks) if not ok]
        raise AssertionError(f"Blocks {missing} are not FSDPModules: fully_shard each Block "
                             "first, so that each is gathered only while it runs; with the root "
                             "alone every weight is gathered for the whole forward.")
    want = str(plan.param_dtype).removeprefix("torch.")
    if model["param_dtype"] != want:
        raise AssertionError(f"FSDP2 gathers the weights in {model['param_dtype']}, but the "
                             f"plan's precision is {plan.precision}: pass mp_policy="
                             f"MixedPrecisionPolicy(param_dtype={want}, reduce_dtype=float32) to "
                             "every fully_shard call.")
    if all(model["checkpointed_blocks"]) != plan.activation_checkpointing:
        verb = "does not" if plan.activation_checkpointing else "does"
        raise AssertionError(f"plan.activation_checkpointing is {plan.activation_checkpointing}"
                             f" but shard_model {verb} checkpoint the Blocks: follow the plan "
                             "(gpulab.memory.checkpoint_blocks, before fully_shard).")
    if any(model["tp_blocks"]) != (plan.tp_size > 1):
        raise AssertionError(f"plan.tp_size is {plan.tp_size}, but the Blocks are "
                             f"{'' if any(model['tp_blocks']) else 'not '}tensor-parallel: apply "
                             "parallelize_module on mesh['tp'] exactly when tp_size > 1.")
    if model["local_param_bytes"] > 1.05 * model["full_param_bytes"] / plan.dp_size:
        raise AssertionError(f"each rank holds {format_bytes(model['local_param_bytes'])} of "
                             f"the {format_bytes(model['full_param_bytes'])} of parameters, more "
                             f"than 1/{plan.dp_size}: shard over mesh['dp'].")


# ----------------------------------------------------------------------------- memory


def check_memory_plan(predict_memory, shard_model, plan, *, seed: int = 0,
                      isolation: str = "auto") -> None:
    """Measure every rank's peak during a steady-state step of the plan on the cluster; it must
    stay within plan.budget_bytes, and predict_memory(config, plan) within 10% of it."""
    _require_own_function(predict_memory, "predict_memory")
    _require(shard_model, "shard_model")
    config = capstone_config(None, seed=seed)
    _plan_for(plan, config)
    try:
        predicted = predict_memory(config, plan)
    except NotImplementedError:
        raise AssertionError(f"predict_memory raised NotImplementedError. {STUB_HINT}") from None
    if isinstance(predicted, bool) or not isinstance(predicted, int | float) or predicted <= 0:
        raise AssertionError(f"predict_memory returned {predicted!r}; return the predicted peak "
                             "bytes of one rank, a positive number.")
    run = _launch("check_memory_plan", {"shard_model": shard_model}, plan, config, steps=2,
                  measure_step=1, isolation=isolation)
    peaks = run.peak_bytes
    kinds = run.ranks[max(range(len(peaks)), key=peaks.__getitem__)]["peak_by_kind"]
    shown = ", ".join(f"{k} {format_bytes(v)}" for k, v in kinds.items() if v and k != "Total")
    print(f"measured peak per rank: {', '.join(map(format_bytes, peaks))} ({shown}); "
          f"predicted {format_bytes(int(predicted))}; budget {format_bytes(plan.budget_bytes)}")
    worst = max(peaks)
    if worst > plan.budget_bytes:
        raise AssertionError(f"a rank peaked at {format_bytes(worst)}, over the plan's budget of "
                             f"{format_bytes(plan.budget_bytes)}: lower the peak (activation "
                             "checkpointing, more grad_accum_steps) or state a budget that "
                             "the plan meets.")
    error = predicted / worst - 1
    if abs(error) > PREDICTION_TOLERANCE:
        missing = "more than was there" if error > 0 else "less than was there"
        raise AssertionError(
            f"predict_memory says {format_bytes(int(predicted))}, the measured peak is "
            f"{format_bytes(worst)} ({error:+.0%}, {missing}; within 10% is needed). At the "
            f"peak the rank held: {shown}. Each rank keeps 1/dp_size of the fp32 weights and "
            "AdamW state (model_states with zero_stage=3), one microbatch's activations in the "
            "gathered dtype (estimate_transformer), and the Blocks gathered at that moment.")


def check_prediction_follows_plan(predict_memory, plan, *, seed: int = 0) -> None:
    """No launch: predict_memory must read the plan. More data-parallel ranks share the model
    states (less per rank); checkpointing and more microbatches shrink the activations."""
    import dataclasses

    _require_own_function(predict_memory, "predict_memory")
    config = capstone_config(None, seed=seed)
    base = dataclasses.replace(plan, tp_size=1, activation_checkpointing=False,
                               grad_accum_steps=1)
    cases = (("dp_size 4 instead of 2", dataclasses.replace(base, dp_size=2),
              dataclasses.replace(base, dp_size=4, grad_accum_steps=2)),
             ("activation checkpointing on", base,
              dataclasses.replace(base, activation_checkpointing=True)))
    for change, before, after in cases:
        try:
            old, new = predict_memory(config, before), predict_memory(config, after)
        except NotImplementedError:
            raise AssertionError(f"predict_memory raised NotImplementedError. {STUB_HINT}") \
                from None
        if not new < old:
            raise AssertionError(f"predict_memory gives {format_bytes(int(new))} with "
                                 f"{change}, against {format_bytes(int(old))} before: it must "
                                 "fall. Read dp_size, micro_batch_size and "
                                 "activation_checkpointing from the plan.")


# ----------------------------------------------------------------------------- resume


def check_elastic_resume(shard_model, save_checkpoint, load_checkpoint, plan, *,
                         steps: int = 6, checkpoint_every: int = 3, kill_at_step: int = 5,
                         seed: int = 0, isolation: str = "auto") -> None:
    """Kill a worker at the start of step kill_at_step; torchrun restarts the group, which must
    resume from the newest complete checkpoint (written by save_checkpoint with
    torch.distributed.checkpoint) and replay the steps since then bit for bit. At least two
    steps are replayed: the first one's loss depends on the weights alone, the second's on the
    update made with the optimizer's state too."""
    for fn, name in ((shard_model, "shard_model"), (save_checkpoint, "save_checkpoint"),
                     (load_checkpoint, "load_checkpoint")):
        _require(fn, name)
    config = capstone_config(None, seed=seed, checkpoint_every=checkpoint_every)
    _plan_for(plan, config)
    if kill_at_step - (kill_at_step // checkpoint_every) * checkpoint_every < 2:
        raise ValueError(f"kill_at_step={kill_at_step} must come at least 2 steps after a "
                         f"checkpoint (every {checkpoint_every}): a lost optimizer state shows "
                         "only in the second replayed step")
    folder = Path(tempfile.mkdtemp(prefix="gpulab-capstone-ckpt-"))
    try:
        run = _launch("check_elastic_resume", {"shard_model": shard_model,
                                               "save_checkpoint": save_checkpoint,
                                               "load_checkpoint": load_checkpoint},
                      plan, config, steps=steps, checkpoint_dir=folder,
                      kill_at_step=kill_at_step, max_restarts=1, measure_step=None,
                      isolation=isolation)
        written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not any(Path(p).name == ".metadata" for p in written):
        raise AssertionError(f"save_checkpoint wrote {written[:6] or 'nothing'} into the "
                             "folder: write with torch.distributed.checkpoint (dcp.save of "
                             "get_state_dict(model, optimizer)), which leaves a .metadata file "
                             "beside each rank's shards.")
    first, second = run.attempt_losses(0), run.attempt_losses(1)
    newest = (kill_at_step // checkpoint_every) * checkpoint_every
    if not second:
        raise AssertionError("no step ran after the restart.")
    print(f"killed at step {kill_at_step}; resumed at step {run.start_step}; first attempt "
          f"{[round(v, 4) for v in first.values()]}, after the restart "
          f"{[round(v, 4) for v in second.values()]}")
    if run.start_step != newest:
        what = ("started over from step 0" if run.start_step == 0 else
                f"resumed at step {run.start_step}")
        raise AssertionError(f"after the restart the run {what}, but the newest complete "
                             f"checkpoint is step {newest}'s: load_checkpoint must load the "
                             "newest checkpoint in the folder and return its step.")
    for step in range(newest, kill_at_step):
        if second[step] != first[step]:
            raise AssertionError(
                f"step {step}, replayed after the resume, gave loss {second[step]!r}; before "
                f"the kill it gave {first[step]!r}. The resumed state is not the one that was "
                "saved: save and load the optimizer's state with the model's "
                "(get_state_dict(model, optimizer), then set_state_dict after dcp.load).")
    reference, tolerance = reference_losses(config, steps), loss_tolerance()
    for step, loss in second.items():
        if abs(loss - reference[step]) > tolerance:
            raise AssertionError(f"step {step} after the resume: loss {loss:.4f}, the "
                                 f"one-process reference {reference[step]:.4f}, though the "
                                 "replayed steps matched: something that shapes the later "
                                 "updates was not restored.")
