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
    check_groups,
    close,
    err,
    layout,
    refuse_borrowed,
    run,
)

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
    case = f"tp_size={tp}" + (f", {len(groups)} groups in {world_size} ranks"
                              if len(groups) > 1 else "")
    results = run(lab5_ranks.sp_block_rank, world_size, SPBlock, data, name="SPBlock", case=case)
    refuse_borrowed("SPBlock", results)
    refs = [_reference(data, g) for g in range(len(groups))]
    for view in (RankView(r, groups) for r in range(world_size)):
        mates = [results[r] for r in view.ranks]
        _grade(results[view.rank], refs[view.group], view, tp, mates)


# ----------------------------------------------------------------------------- the shards


def _expected(block, me: int, tp: int, grads: bool = False) -> dict[str, torch.Tensor]:
    """What rank `me` of the group holds (or their gradients), by the whole Block's names."""
    attn, ff = block.attn, block.ff

    def of(p):
        return p.grad if grads else p.detach()

    def rows(p):
        return of(p).chunk(tp, 0)[me]

    def cols(p):
        return of(p).chunk(tp, 1)[me]

    out = {name: of(p) for name, p in (("ln_1.weight", block.ln_1.weight),
                                       ("ln_1.bias", block.ln_1.bias),
                                       ("ln_2.weight", block.ln_2.weight),
                                       ("ln_2.bias", block.ln_2.bias))}
    for name in ("q_proj", "k_proj", "v_proj"):
        layer = getattr(attn, name)
        out[f"{name}.weight"], out[f"{name}.bias"] = rows(layer.weight), rows(layer.bias)
    out["out_proj.weight"], out["out_proj.bias"] = cols(attn.out_proj.weight), of(
        attn.out_proj.bias)
    out["fc.weight"], out["fc.bias"] = rows(ff.fc.weight), rows(ff.fc.bias)
    out["proj.weight"], out["proj.bias"] = cols(ff.proj.weight), of(ff.proj.bias)
    return out


def _fused(shards: dict) -> dict[str, torch.Tensor]:
    """q, k and v's shards fused into one layer: [q_r; k_r; v_r] along the output features."""
    return {f"qkv.{kind}": torch.cat([shards[f"{n}_proj.{kind}"] for n in "qkv"])
            for kind in ("weight", "bias")}


def _match(params: dict, want: dict, block, me: int, tp: int, where: str) -> dict[str, str]:
    """For each of the whole Block's names, the learner's parameter that holds its shard (a
    fused q, k, v counts for the three); AssertionError naming the first one missing."""
    found: dict[str, str] = {}

    def holder(value):
        return next((n for n, p in params.items() if n not in found.values()
                     and p["value"].shape == value.shape and torch.equal(p["value"], value)),
                    None)

    for key, value in want.items():
        mine = holder(value)
        if mine is not None:
            found[key] = mine
    separate = [f"{n}_proj.{kind}" for n in "qkv" for kind in ("weight", "bias")]
    if any(key not in found for key in separate):
        for key, value in _fused(want).items():
            mine = holder(value)
            if mine is not None:
                found[key] = mine
        if all(f"qkv.{kind}" in found for kind in ("weight", "bias")):
            for key in separate:
                found.pop(key, None)
    missing = [k for k in want if k not in found
               and not (k in separate and "qkv.weight" in found)]
    if missing:
        raise AssertionError(f"SPBlock(block, group), {where}: "
                             + _missing_shard(missing[0], params, block, me, tp))
    extra = [n for n in params if n not in found.values()]
    if extra:
        shapes = ", ".join(f"{n} {tuple(params[n]['value'].shape)}" for n in extra[:4])
        raise AssertionError(
            f"SPBlock(block, group), {where}: it also holds {shapes}, beyond this rank's "
            "shards. Each rank keeps its heads of q, k, v and out_proj, its hidden units of fc "
            "and proj, and the norms and the two row-parallel biases whole: nothing else.")
    return found


def _missing_shard(key: str, params: dict, block, me: int, tp: int) -> str:
    """Why no parameter holds `key`'s shard: the whole layer, the wrong dim, or other rows."""
    layer_name, kind = key.rsplit(".", 1)
    layer = {"q_proj": block.attn.q_proj, "k_proj": block.attn.k_proj,
             "v_proj": block.attn.v_proj, "out_proj": block.attn.out_proj,
             "fc": block.ff.fc, "proj": block.ff.proj}.get(layer_name)
    if layer is None:
        return (f"no parameter holds {key} whole: every rank keeps the layer norms (copies), "
                "and applies them to its own tokens.")
    whole = getattr(layer, kind).detach()
    values = [p["value"] for p in params.values()]
    n_head = CONFIG["n_head"]
    if any(v.shape == whole.shape and torch.equal(v, whole) for v in values):
        attention = layer_name in ("q_proj", "k_proj", "v_proj", "out_proj")
        what = "attention is left whole" if attention else "the MLP is left whole"
        return (f"{what}: a parameter holds all of {key}, {tuple(whole.shape)}, on every rank. "
                f"Each rank holds n_head / tp_size = {n_head // tp} of the {n_head} heads: its "
                "rows of q, k and v, and the matching columns of out_proj (and its hidden units "
                "of fc and proj).")
    other_dim = whole.chunk(tp, 1 if layer_name in ("q_proj", "k_proj", "v_proj", "fc") else 0)
    if kind == "weight" and any(v.shape == other_dim[me].shape and torch.equal(v, other_dim[me])
                                for v in values):
        column = layer_name in ("q_proj", "k_proj", "v_proj", "fc")
        return (f"{key} is split along the wrong dimension: a parameter holds its "
                f"{'columns (input features)' if column else 'rows (output features)'} "
                f"{tuple(other_dim[me].shape)}. nn.Linear's weight is (out, in); "
                + ("q, k, v and fc are split by output features, its rows: a head is head_size "
                   "consecutive output features, so a block of rows is whole heads."
                   if column else "out_proj and proj are split by input features, its columns: "
                   "the ones that read this rank's heads (or hidden units)."))
    if kind == "weight":
        heads = f"heads {me * n_head // tp} to {(me + 1) * n_head // tp - 1}"
        return (f"no parameter holds this rank's block of {key}, shape "
                f"{tuple(_expected(block, me, tp)[key].shape)}: rank {me} of the group holds "
                f"block {me} of {tp} ({heads} for the attention), a copy of consecutive "
                f"{'rows' if layer_name in ('q_proj', 'k_proj', 'v_proj', 'fc') else 'columns'}"
                ", as in Parts 1 and 2.")
    return (f"no parameter holds this rank's share of {key}: column-parallel biases are split "
            "like their weight's rows; the row-parallel biases (out_proj's, proj's) are kept "
            "whole and added once, to the summed output.")


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
    names = _match(res["params"], _expected(block, view.me, tp), block, view.me, tp, where)
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
    _check_grads(res, names, _expected(block, view.me, tp, grads=True), where, mates)
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
        fused = _fused(want)
        want = {k: v for k, v in want.items() if not k.startswith(("q_proj", "k_proj", "v_proj"))}
        want.update(fused)
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
