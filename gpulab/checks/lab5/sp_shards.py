"""What Lab 5's Part 6 checker expects each rank of a group to hold (sp_block.py): its block of
every layer of a gpulab.models.Block, by the whole Block's parameter names, and which of the
learner's parameters holds each one, matched by value. A missing shard is explained: the whole
layer kept (attention left replicated), the other dimension kept (heads split the wrong way),
or another block of rows kept (heads interleaved across ranks).
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (section 7)
"""

from __future__ import annotations

import torch


def expected_shards(block, me: int, tp: int, grads: bool = False) -> dict[str, torch.Tensor]:
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


def fused(shards: dict) -> dict[str, torch.Tensor]:
    """q, k and v's shards fused into one layer: [q_r; k_r; v_r] along the output features."""
    return {f"qkv.{kind}": torch.cat([shards[f"{n}_proj.{kind}"] for n in "qkv"])
            for kind in ("weight", "bias")}


def match_shards(params: dict, want: dict, block, me: int, tp: int, where: str) -> dict[str, str]:
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
        for key, value in fused(want).items():
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
    n_head = block.attn.q_proj.out_features // block.attn.head_size
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
                f"{tuple(expected_shards(block, me, tp)[key].shape)}: rank {me} of the group holds "
                f"block {me} of {tp} ({heads} for the attention), a copy of consecutive "
                f"{'rows' if layer_name in ('q_proj', 'k_proj', 'v_proj', 'fc') else 'columns'}"
                ", as in Parts 1 and 2.")
    return (f"no parameter holds this rank's share of {key}: column-parallel biases are split "
            "like their weight's rows; the row-parallel biases (out_proj's, proj's) are kept "
            "whole and added once, to the summed output.")
