"""Checker for Lab 5, Part 1 (solutions/lab5_parallelism_across_nodes/...): Megatron's f and g
and the two parallel linear layers, written by the learner, against the whole nn.Linear.

    check_tp_linear(CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear)

One launch of tp_size gloo ranks (or world_size ranks in strided groups of tp_size) runs, on
each rank: CopyToTP and ReduceFromTP alone, then each layer built from a full nn.Linear, with and
without bias. The checker then compares, rank by rank: each shard's shape and values (its own
copy, not a view of the whole weight), the output, the input's gradient and each shard's
gradient with the matching block of the full layer's; every collective on the group passed in,
and as many as Megatron's layers make (f: one all-reduce backward; g: one forward). Part 2
(TPMLP) is in tp_mlp.py, Part 3 (1F1B) in one_f_one_b.py; what they share, in
shared.py.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import torch
from torch import nn

from gpulab.checks.harness.owned import require_own_class
from gpulab.checks.lab5 import ranks as lab5_ranks
from gpulab.checks.lab5.shared import (
    RankView,
    case_label,
    check_counts,
    check_groups,
    close,
    err,
    layout,
    refuse_borrowed,
    require_function,
    run,
)

B, T = 2, 3  # every input is (B, T, features): code must work on any leading dims


def _randn(g, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _linear_data(tp: int, groups, seed: int) -> dict:
    """Each group's inputs: other numbers for each group. in_features != out_features, so a
    weight kept the wrong way round has the wrong shape too."""
    g = torch.Generator().manual_seed(seed)
    n_in, n_out, n = 4 * tp, 6 * tp, len(groups)
    data = {"tp": tp, "groups": groups,
            "copy_x": [_randn(g, B, T, n_in) for _ in range(n)],
            "copy_upstream": [_randn(g, tp, B, T, n_in) for _ in range(n)],
            "reduce_x": [_randn(g, tp, B, T, n_out) for _ in range(n)],
            "reduce_upstream": [_randn(g, B, T, n_out) for _ in range(n)], "layers": []}
    for label, bias in (("a layer with bias", True), ("a layer without bias", False)):
        data["layers"].append({"label": label, "layers": [
            {"weight": _randn(g, n_out, n_in, scale=0.5),
             "bias": _randn(g, n_out) + 2.0 if bias else None,  # far from 0: a wrong bias shows
             "x": _randn(g, B, T, n_in), "upstream": _randn(g, B, T, n_out)} for _ in range(n)]})
    return data


def check_tp_linear(CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear,
                    tp: int = 2, seed: int = 0, world_size: int | None = None) -> None:
    """On tp_size ranks (or world_size ranks in strided groups of tp): CopyToTP is identity
    forward and all-reduce backward, ReduceFromTP the reverse; ColumnParallelLinear(full, group)
    keeps this rank's rows of the weight and bias and returns its slice of the output;
    RowParallelLinear(full, group) keeps this rank's columns and the whole bias, and returns
    the whole output on every rank. Outputs, the input's gradient and the shards' gradients
    equal the full layer's (with and without bias); every collective on the group passed in."""
    require_function(CopyToTP, "CopyToTP")
    require_function(ReduceFromTP, "ReduceFromTP")
    require_own_class(ColumnParallelLinear, "ColumnParallelLinear")
    require_own_class(RowParallelLinear, "RowParallelLinear")
    world_size, groups = layout(tp, world_size)
    data = _linear_data(tp, groups, seed)
    case = case_label(tp, world_size, groups)
    classes = (CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear)
    results = run(lab5_ranks.tp_linear_rank, world_size, classes, data,
                   name="The tensor-parallel layers", case=case)
    refuse_borrowed("The tensor-parallel layers", results)
    views = [RankView(r, groups) for r in range(world_size)]
    for r, view in enumerate(views):
        _grade_copy(results[r]["copy"], data, view, tp)
    for r, view in enumerate(views):
        _grade_reduce(results[r]["reduce"], data, view, tp)
    for layer_case in data["layers"]:
        for kind in ("column", "row"):
            per_rank = [results[r][(kind, layer_case["label"])] for r in range(world_size)]
            for res, view in zip(per_rank, views, strict=True):  # every rank's shard first
                _grade_shards(res, kind, layer_case, view, tp)
            for res, view in zip(per_rank, views, strict=True):
                _grade_layer(res, kind, layer_case, view, tp)


def _grade_copy(res: dict, data: dict, view: RankView, tp: int) -> None:
    name, where = "CopyToTP", str(view)
    check_groups(name, res["calls"], where)
    x, upstream = data["copy_x"][view.group], data["copy_upstream"][view.group]
    if not close(res["y"], x):
        hint = (" It is tp_size times x: the forward all-reduced. f's forward is the identity: "
                "every rank of the group already holds the whole x." if close(res["y"], tp * x)
                else " Return x itself (x.view_as(x), or x.clone()).")
        raise AssertionError(f"{name}.apply(x, group), {where}: the output is not x "
                             f"({err(res['y'], x)}).{hint}")
    want = upstream.sum(0)
    if not close(res["x_grad"], want):
        if close(res["x_grad"], upstream[view.me]):
            hint = ("it is this rank's own output gradient, unchanged: CopyToTP's backward must "
                    "all-reduce it (sum over the group), since x feeds every rank's shard and "
                    "dL/dx is the sum of their contributions.")
        elif close(res["x_grad"], want / tp):
            hint = "it is the mean over the group: all-reduce sums; do not divide."
        else:
            hint = (f"it should be the sum over the group of the output gradients "
                    f"({err(res['x_grad'], want)}).")
        raise AssertionError(f"{name}, {where}: the input's gradient is wrong: {hint}")
    check_counts(name, res["calls"], where, forward=0, backward=1)


def _grade_reduce(res: dict, data: dict, view: RankView, tp: int) -> None:
    name, where = "ReduceFromTP", str(view)
    check_groups(name, res["calls"], where)
    parts, upstream = data["reduce_x"][view.group], data["reduce_upstream"][view.group]
    want = parts.sum(0)
    if not close(res["y"], want):
        if close(res["y"], parts[view.me]):
            hint = ("it is this rank's own partial, unchanged: ReduceFromTP's forward must "
                    "all-reduce (sum the partial outputs over the group).")
        elif close(res["y"], want / tp):
            hint = "it is the mean over the group: all-reduce sums; do not divide."
        else:
            hint = f"it should be the sum over the group ({err(res['y'], want)})."
        raise AssertionError(f"{name}.apply(x, group), {where}: the output is wrong: {hint}")
    if not close(res["x_grad"], upstream):
        hint = (" It is tp_size times the output's gradient: the backward all-reduced. g's "
                "backward is the identity: every rank already holds the whole dL/dy, and "
                "d(sum)/d(partial) is 1." if close(res["x_grad"], tp * upstream) else
                f" It should be the output's gradient itself ({err(res['x_grad'], upstream)}).")
        raise AssertionError(f"{name}, {where}: the input's gradient is wrong.{hint}")
    check_counts(name, res["calls"], where, forward=1, backward=0)


def _linear_reference(layer: dict) -> dict:
    full = nn.Linear(layer["weight"].shape[1], layer["weight"].shape[0],
                     bias=layer["bias"] is not None)
    with torch.no_grad():
        full.weight.copy_(layer["weight"])
        if layer["bias"] is not None:
            full.bias.copy_(layer["bias"])
    x = layer["x"].clone().requires_grad_()
    y = full(x)
    (y * layer["upstream"]).sum().backward()  # as on the ranks
    return {"y": y.detach(), "x_grad": x.grad, "weight_grad": full.weight.grad,
            "bias_grad": None if full.bias is None else full.bias.grad}


def _block(kind: str, layer: dict, view: RankView, tp: int) -> slice:
    """This rank's block: of the rows (output features) for the column layer, of the columns
    (input features) for the row layer."""
    n_out, n_in = layer["weight"].shape
    per = (n_out if kind == "column" else n_in) // tp
    return slice(view.me * per, (view.me + 1) * per)


def _grade_shards(res: dict, kind: str, layer_case: dict, view: RankView, tp: int) -> None:
    layer = layer_case["layers"][view.group]
    column = kind == "column"
    name = "ColumnParallelLinear" if column else "RowParallelLinear"
    where = f"{layer_case['label']}, {view}"
    check_groups(name, res["calls"], where)
    if res["params"] is None:
        raise AssertionError(f"{name}(full, group) gave a {res['module']}, not an nn.Module: "
                             f"define `class {name}(nn.Module):` and call super().__init__() "
                             "first in __init__.")
    block = _block(kind, layer, view, tp)
    shards = {"weight": layer["weight"][block] if column else layer["weight"][:, block],
              "bias": None if layer["bias"] is None else
              layer["bias"][block] if column else layer["bias"]}
    _check_shards(name, where, res["params"], shards, layer, column, tp, view)


def _grade_layer(res: dict, kind: str, layer_case: dict, view: RankView, tp: int) -> None:
    """After every rank's shards passed: the output and the gradients, then the collectives."""
    layer = layer_case["layers"][view.group]
    ref = _linear_reference(layer)
    column = kind == "column"
    name = "ColumnParallelLinear" if column else "RowParallelLinear"
    where = f"{layer_case['label']}, {view}"
    block = _block(kind, layer, view, tp)
    if res["skipped"]:  # another rank's shard had the wrong shape: its message came first
        raise AssertionError(f"{name}, {where}: a shard of the wrong shape on some rank; every "
                             "rank keeps 1/tp_size of the split dimension.")
    y_want = ref["y"][..., block] if column else ref["y"]
    x = layer["x"] if column else layer["x"][..., block]
    if not close(res["y"], y_want):
        mistake = _output_mistake(res["y"], y_want, ref, layer, x, block, column, tp)
        raise AssertionError(f"{name}.forward, {where}: {mistake}")
    x_grad = ref["x_grad"] if column else ref["x_grad"][..., block]
    if not res["backward"]:
        raise AssertionError(f"{name}, {where}: the output does not need a gradient: compute it "
                             "from x and the parameters inside the autograd graph.")
    if not close(res["x_grad"], x_grad):
        mistake = _input_grad_mistake(res["x_grad"], x_grad, layer, block, column, tp)
        raise AssertionError(f"{name}, {where}: the input's gradient is wrong: {mistake}")
    grads = {"weight": ref["weight_grad"][block] if column else ref["weight_grad"][:, block],
             "bias": None if ref["bias_grad"] is None else
             ref["bias_grad"][block] if column else ref["bias_grad"]}
    for pname, want in grads.items():
        if want is None:
            continue
        got = res["grads"].get(pname)
        if got is None or not close(got, want):
            times = (" It is tp_size times the right one: the output's gradient was all-reduced "
                     "on its way back (g's backward is the identity)."
                     if got is not None and close(got, tp * want) else "")
            raise AssertionError(f"{name}, {where}: the gradient of {pname} is wrong "
                                 f"({'None' if got is None else err(got, want)}); it should be "
                                 f"this rank's block of the full layer's.{times}")
    check_counts(name, res["calls"], where, forward=0 if column else 1,
                  backward=1 if column else 0)


def _check_shards(name, where, params, shards, layer, column, tp, view) -> None:
    n_out, n_in = layer["weight"].shape
    wanted = "rows (output features)" if column else "columns (input features)"
    other = "columns (input features)" if column else "rows (output features)"
    got = params.get("weight")
    want = shards["weight"]
    if got is None:
        raise AssertionError(f"{name}(full, group), {where}: no parameter named `weight`. Keep "
                             f"this rank's block of full.weight as self.weight = "
                             "nn.Parameter(...), so that an optimizer sees it.")
    shape = tuple(got["value"].shape)
    if shape != tuple(want.shape):
        if shape == (n_out, n_in):
            hint = f"that is the whole weight: keep only this rank's block of {wanted}."
        elif shape == ((n_out, n_in // tp) if column else (n_out // tp, n_in)):
            hint = (f"you kept {other} instead of {wanted}. nn.Linear stores its weight as "
                    f"(out_features, in_features): the {'column' if column else 'row'}-parallel "
                    f"layer splits the {'output' if column else 'input'} features, so this rank "
                    f"keeps full.weight[{'block' if column else ':, block'}].")
        else:
            hint = ("each rank keeps 1/tp_size of the split dimension, tp_size = "
                    "dist.get_world_size(group), at its place in the group, "
                    "dist.get_rank(group) (not its place in the world).")
        raise AssertionError(f"{name}(full, group), {where}: self.weight has shape {shape}, "
                             f"expected {tuple(want.shape)}: {hint}")
    if not torch.equal(got["value"], want):
        per = want.shape[0] if column else want.shape[1]
        blocks = [layer["weight"][k * per:(k + 1) * per] if column else
                  layer["weight"][:, k * per:(k + 1) * per] for k in range(tp)]
        other_rank = next((k for k, b in enumerate(blocks) if torch.equal(got["value"], b)),
                          None)
        hint = (f"it holds the block of the group's rank {other_rank}: this rank's place in "
                "its group is dist.get_rank(group), not dist.get_rank()." if other_rank is not
                None else f"it should be a copy of full.weight's {wanted} "
                f"{view.me * per}:{(view.me + 1) * per}.")
        raise AssertionError(f"{name}(full, group), {where}: self.weight holds the wrong "
                             f"values: {hint}")
    _check_bias(name, where, params, shards["bias"], column)
    if not all(p["own_storage"] for p in params.values()):
        bad = next(n for n, p in params.items() if not p["own_storage"])
        raise AssertionError(
            f"{name}(full, group), {where}: self.{bad} is a view into the full layer's tensor, "
            "so the whole of it stays in memory, which is what tensor parallelism is there to "
            "avoid. Keep a copy of the block: nn.Parameter(full.weight[...].clone()).")
    total = sum(p["value"].numel() for p in params.values())
    expected = want.numel() + (0 if shards["bias"] is None else shards["bias"].numel())
    if total != expected:
        extra = [n for n in params if n not in ("weight", "bias")]
        raise AssertionError(
            f"{name}(full, group), {where}: the module holds {total} parameter elements, its "
            f"shard has {expected}; it also holds {', '.join(extra) or 'more'}. Keep only this "
            "rank's shard (self.full = full would register the whole layer).")


def _check_bias(name, where, params, want, column) -> None:
    got = params.get("bias")
    if want is None:
        if got is not None:
            raise AssertionError(f"{name}(full, group), {where}: the full layer has no bias, "
                                 "but the shard has one: set self.bias = None.")
        return
    if got is None:
        raise AssertionError(f"{name}(full, group), {where}: no parameter named `bias`, but the "
                             "full layer has one: keep " + ("this rank's block of it" if column
                                                            else "all of it") +
                             " as self.bias = nn.Parameter(...).")
    if not torch.equal(got["value"], want) if got["value"].shape == want.shape else True:
        hint = ("the column-parallel layer keeps the bias entries of its own output features."
                if column else "the row-parallel layer keeps the whole bias on every rank (each "
                "rank computes all the output features, partially) and adds it once, after the "
                "sum.")
        raise AssertionError(f"{name}(full, group), {where}: self.bias has shape "
                             f"{tuple(got['value'].shape)}, expected {tuple(want.shape)}, or "
                             f"other values: {hint}")


def _output_mistake(got, want, ref, layer, x, block, column, tp) -> str:
    weight, bias = layer["weight"], layer["bias"]
    if column:
        if close(got, ref["y"]):
            return ("it returned the whole output. The column-parallel layer returns only this "
                    "rank's slice of the output features (no gather): the row-parallel layer "
                    "that follows takes exactly that slice.")
        if bias is not None and close(got, want - bias[block]):
            return "the bias is missing: add this rank's block of it."
        return f"it should be this rank's slice of full(x) ({err(got, want)})."
    partial = x @ weight[:, block].T
    if bias is not None and close(got, want + (tp - 1) * bias):
        return (f"the bias was added on every rank before the sum: the output has tp_size = "
                f"{tp} times the bias. Add it once, after the all-reduce.")
    if close(got, partial) or bias is not None and close(got, partial + bias):
        return ("it is this rank's partial product: the row-parallel layer must sum the "
                "partials over the group, ReduceFromTP.apply(partial, self.group), before the "
                "bias.")
    if bias is not None and close(got, want - bias):
        return "the bias is missing: add the whole bias once, after the sum."
    return f"it should be full(x), the same on every rank ({err(got, want)})."


def _input_grad_mistake(got, want, layer, block, column, tp) -> str:
    if column:
        own = layer["upstream"][..., block] @ layer["weight"][block]
        if close(got, own):
            return ("it is only this rank's share, dL/dy_r W_r. x feeds every rank's shard, so "
                    "dL/dx is the sum of the ranks' shares: the forward must start with "
                    "CopyToTP.apply(x, self.group), whose backward all-reduces.")
    if close(got, tp * want):
        return ("it is tp_size times the right one: an all-reduce too many on the way back "
                "(the row-parallel layer's input gradient is this rank's own, no sum).")
    return f"{err(got, want)}."
