"""Checker for Lab 5, Part 6 (solutions/lab5_parallelism_across_nodes/...): SPBlock, a whole GPT
Block split over a tensor-parallel group, attention by heads and the MLP by hidden units, with
sequence parallelism around the layer norms (Korthikanti et al. 2022), against the unsplit
gpulab.models.Block.

    check_sp_block(SPBlock, tp=2)       one launch of tp_size ranks (or strided groups of tp)

On each rank, SPBlock(block, group) is built around a Block with random weights (biases and
norms too: a part kept twice or summed once too often must show), runs forward on this rank's
T / tp_size tokens of the input, backward with the same tokens of the output's gradient, then
sync_replicated_grads(). The reference is the whole Block run here, in the checker's process,
on the whole sequence; the ranks never see it. The checker compares the parameters each rank
holds (its rows of q, k, v and fc, its columns of out_proj and proj, separate or q, k, v fused;
the norms and the two row-parallel biases whole), the output and the input's gradient on its
tokens, and every parameter's gradient after the sync; then the collectives, against
gpulab's formula for one layer with sequence parallelism (tp_transformer.tp_layer_comm): their
kinds in order in forward and in backward, the elements of each, and all-reduces only in the
sync.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (sections 7 and 8)
"""

from __future__ import annotations

import torch

from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.lab5 import ranks as lab5_ranks
from gpulab.checks.lab5.shared import (
    RankView,
    case_label,
    check_groups,
    close,
    err,
    layout,
    refuse_borrowed,
    run,
)
from gpulab.checks.lab5.sp_shards import expected_shards, fused, match_shards

B, T = 2, 4  # T is split over the group: tp_size must divide it
CONFIG = {"n_embd": 8, "n_head": 4, "block_size": T, "dropout": 0.0}
REPLICATED = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "out_proj.bias",
              "proj.bias")  # whole on every rank, applied to its own tokens: synced after
GATHER = ("all_gather", "all_gather_into_tensor")
SCATTER = ("reduce_scatter", "reduce_scatter_tensor")


def _block_data(tp: int, groups, seed: int) -> dict:
    from gpulab.models import Block, GPTConfig

    g = torch.Generator().manual_seed(seed)
    states = []
    for _ in groups:
        block = Block(GPTConfig(**CONFIG))
        with torch.no_grad():
            for p in block.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.4)
        states.append(block.state_dict())
    x = [torch.randn(B, T, CONFIG["n_embd"], generator=g) for _ in groups]
    upstream = [torch.randn(B, T, CONFIG["n_embd"], generator=g) for _ in groups]
    return {"groups": groups, "config": CONFIG, "state": states, "x": x,
            "upstream": upstream, "tokens": T // tp}


def _reference(data: dict, g: int):
    """The whole Block on the group's whole sequence, forward and backward."""
    from gpulab.models import Block, GPTConfig

    block = Block(GPTConfig(**data["config"]))
    block.load_state_dict(data["state"][g])
    x = data["x"][g].clone().requires_grad_()
    y = block(x)
    (y * data["upstream"][g]).sum().backward()
    return block, y.detach(), x.grad


def check_sp_block(SPBlock, tp: int = 2, seed: int = 0, world_size: int | None = None) -> None:
    """SPBlock(block, group) on tp_size ranks (or world_size ranks in strided groups of tp):
    this rank's heads and hidden units only; forward on this rank's tokens, backward and
    sync_replicated_grads() equal the whole Block's; per layer, 2 all-gathers and 2
    reduce-scatters of the (B, T, C) activation each way, all-reduces only in the sync."""
    require_own_class(SPBlock, "SPBlock")
    world_size, groups = layout(tp, world_size)
    if CONFIG["n_head"] % tp or T % tp:
        raise ValueError(f"tp={tp} must divide the {CONFIG['n_head']} heads and the {T} tokens")
    data = _block_data(tp, groups, seed)
    case = case_label(tp, world_size, groups)
    results = run(lab5_ranks.sp_block_rank, world_size, SPBlock, data, name="SPBlock", case=case)
    refuse_borrowed("SPBlock", results)
    refs = [_reference(data, g) for g in range(len(groups))]
    for view in (RankView(r, groups) for r in range(world_size)):
        mates = [results[r] for r in view.ranks]
        _grade(results[view.rank], refs[view.group], view, tp, mates)


# ----------------------------------------------------------------------------- grading


def _phase(phase: str) -> str:
    for kind in ("sync", "backward", "forward"):
        if phase.startswith(kind) or (kind == "backward" and "backward" in phase):
            return kind
    return "init"


def _grade(res: dict, ref, view: RankView, tp: int, mates: list[dict]) -> None:
    block, y, x_grad = ref
    where = str(view)
    check_groups("SPBlock", res["calls"], where)
    if res["params"] is None:
        raise AssertionError(f"SPBlock(block, group) gave a {res['module']}, not an nn.Module: "
                             "define `class SPBlock(nn.Module):` and call super().__init__().")
    want = expected_shards(block, view.me, tp)
    names = match_shards(res["params"], want, block, view.me, tp, where)
    if res["error"] is not None:
        raise AssertionError(f"SPBlock, {where}: forward, backward or sync_replicated_grads() "
                             f"raised {res['error']}")
    mine = slice(view.me * (T // tp), (view.me + 1) * (T // tp))
    if not close(res["y"], y[:, mine]):
        raise AssertionError(f"SPBlock.forward, {where}: {_output_mistake(res, y[:, mine])}")
    if not res["backward"]:
        raise AssertionError(f"SPBlock.forward, {where}: its output does not need a gradient; "
                             "compute it from x and the parameters inside the graph.")
    if not close(res["x_grad"], x_grad[:, mine]):
        raise AssertionError(
            f"SPBlock, {where}: the gradient of this rank's tokens is wrong "
            f"({err(res['x_grad'], x_grad[:, mine])}). Every rank's heads and hidden units "
            "read the whole gathered sequence, so the all-gather's backward must sum the ranks' "
            "gradients and keep this rank's tokens: a reduce-scatter.")
    _check_grads(res, names, expected_shards(block, view.me, tp, grads=True), where, mates)
    _check_collectives(res["calls"], tp, where)


def _output_mistake(res: dict, want: torch.Tensor) -> str:
    got, forward = res["y"], [c for c, phase, _, _ in res["calls"] if _phase(phase) == "forward"]
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return (f"the output is wrong: {err(got, want)}; it must be this rank's tokens of the "
                f"Block's output, (B, T / tp_size, C) = {tuple(want.shape)}.")
    sums = [c for c in forward if c in SCATTER or c == "all_reduce"]
    if len(sums) < 2:
        return (f"the output is off ({err(got, want)}) and its forward summed partial outputs "
                f"{len(sums)} time(s), for 2 row-parallel layers: an all-reduce is missing. "
                "out_proj (and proj) each return one rank's term of a sum over the heads (the "
                "hidden units): sum them over the group, here with a reduce-scatter, the "
                "all-reduce's first half, which also leaves each rank its own tokens.")
    return (f"it differs from the whole Block's on this rank's tokens ({err(got, want)}). "
            "x + attn(ln_1(x)), then x + ff(ln_2(x)): gather the normed tokens before q, k, v "
            "(and fc), run this rank's heads on the whole sequence with the causal mask, "
            "reduce-scatter out_proj's partial sums, and add the biases once, after the sum.")


def _check_grads(res: dict, names: dict, want: dict, where: str, mates: list[dict]) -> None:
    grads = res["grads"] or {}
    if "qkv.weight" in names:
        together = fused(want)
        want = {k: v for k, v in want.items() if not k.startswith(("q_proj", "k_proj", "v_proj"))}
        want.update(together)
    for key, expected in want.items():
        mine = names[key]
        got = grads.get(mine)
        if got is not None and close(got, expected):
            continue
        if key in REPLICATED and got is not None and _sums_to(mine, mates, expected):
            raise AssertionError(
                f"SPBlock, {where}: the gradient of {mine} ({key}) is this rank's part only "
                f"({err(got, expected)}); the group's parts add up to the whole Block's. The "
                "norms (and the biases added after the reduce-scatter) saw only this rank's "
                "tokens: sync_replicated_grads() must all-reduce their gradients over the group."
                + ("" if res["synced"] else " SPBlock has no sync_replicated_grads()."))
        raise AssertionError(
            f"SPBlock, {where}: the gradient of {mine} (this rank's share of {key}) is wrong "
            f"({'None' if got is None else err(got, expected)}); it should be the matching "
            f"block of the whole Block's {key}.grad.")


def _sums_to(name: str, mates: list[dict], expected: torch.Tensor) -> bool:
    parts = [(m["grads"] or {}).get(name) for m in mates]
    if any(p is None or p.shape != expected.shape for p in parts):
        return False
    return close(torch.stack(parts).sum(0), expected)


def _check_collectives(calls, tp: int, where: str) -> None:
    """Kinds in order and sizes against tp_layer_comm's formula; all-reduces only in the sync."""
    from gpulab.distributed.tp_transformer import tp_layer_comm

    layer = tp_layer_comm(CONFIG["n_embd"], tp, sequence_parallel=True, bytes_per_element=4)
    whole = layer.message_bytes * B * T // 4  # elements of one (B, T, C) activation
    for kind, want in (("forward", layer.forward), ("backward", layer.backward)):
        made = [(c, numel) for c, phase, _, numel in calls if _phase(phase) == kind]
        said = [("all_gather" if c in GATHER else "reduce_scatter" if c in SCATTER else c)
                for c, _ in made]
        if said != list(want):
            reduced = "all_reduce" in said
            raise AssertionError(
                f"SPBlock, {where}: its {kind} made {', '.join(said) or 'no collective'}; with "
                f"sequence parallelism one layer makes {', '.join(want)} (2 all-gathers and 2 "
                "reduce-scatters each way, gpulab's tp_layer_comm). "
                + ("An all-reduce of the whole sequence sends twice the bytes of a reduce-"
                   "scatter and leaves every rank tokens it then throws away: reduce-scatter "
                   "after out_proj and proj, all-gather before q, k, v and fc."
                   if reduced else "The numbers came out right, so the extra work was wasted."))
        for c, numel in made:
            if numel not in (whole, whole // tp):
                raise AssertionError(
                    f"SPBlock, {where}: dist.{c} in {kind} moved {numel} elements; each of the "
                    f"layer's collectives moves the (B, T, C) activation, {whole} elements "
                    f"({whole // tp} per rank): gather the normed input of q, k, v (and of fc) "
                    "once, not each projection or the hidden units.")
    sync = [c for c, phase, _, _ in calls if _phase(phase) == "sync" and c != "all_reduce"]
    if sync:
        raise AssertionError(f"SPBlock, {where}: sync_replicated_grads() made dist.{sync[0]}: "
                             "it sums gradients, with all-reduces only.")
