"""Capstone, Part 1: sharded training on the cluster equals one process (check_sharded_training).
"""

from __future__ import annotations

from gpulab.capstone import capstone_config, reference_losses
from gpulab.checks.capstone.common import (
    launch_on_cluster,
    loss_tolerance,
    require_learner_code,
    require_valid_plan,
)
from gpulab.memory import format_bytes


def check_sharded_training(shard_model, plan, *, steps: int = 4, seed: int = 0,
                           isolation: str = "auto") -> None:
    """Train `steps` steps with shard_model(model, mesh, plan) on the 2x2 cluster and compare
    each step's loss with the same training in one process; check that shard_model sharded
    every Block and the root with FSDP2 in the plan's precision, as the plan says."""
    require_learner_code(shard_model, "shard_model")
    config = capstone_config(None, seed=seed)
    require_valid_plan(plan, config)
    run = launch_on_cluster("check_sharded_training", {"shard_model": shard_model}, plan, config,
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


