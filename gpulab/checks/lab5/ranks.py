"""What Lab 5's tensor-parallel checkers run on each rank: the learner's classes, recorded.

Each `*_rank` function is the body of one launch, fn(rank, world_size, ..., log_dir). The ranks
split into groups of tp_size (`data["groups"]`, lists of global ranks: with more ranks than
tp_size the groups are strided, [0, 2] and [1, 3], so that neither the default group nor a
rank's place in the world is its place in its group). Each rank runs the learner's code on the
inputs the checker chose for its group, records the collectives it made (and on which group),
and returns plain tensors; the checkers (tp_linear.py, tp_mlp.py, sp_block.py) grade those in
the notebook's process.

    tp_linear_rank   Part 1: CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear
    tp_mlp_rank      Part 2: TPMLP around a gpulab.models.FeedForward (a GPT Block's MLP)
    sp_block_rank    Part 6: SPBlock around a gpulab.models.Block, on this rank's tokens

Shipped by value, like lab3/ranks.py: a rank imports torch and not gpulab.checks, whose Lab 1
checkers load Numba, so nothing here may import gpulab.checks (harness/calls.py travels by value
too).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gpulab.checks.harness.calls import CallLog, log_path


class GroupLog(CallLog):
    """A CallLog that also notes, for each call, the group it was made on: "given" (the group
    the checker passed), "default" (group=None, or the world's group) or "another"."""

    def __init__(self, path: str, group):
        super().__init__(path)
        self.group = group

    def _record(self, name, original, signature, args, kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments if signature else {}
        except TypeError:
            bound = {}
        group = bound.get("group")
        index = len(self.calls)
        result = super()._record(name, original, signature, args, kwargs)
        if group is self.group:
            tag = "given"
        elif group is None or group is dist.group.WORLD:
            tag = "default"
        else:
            tag = "another"
        if index < len(self.calls):
            self.calls[index]["group"] = tag
        return result


def _join_groups(rank: int, groups: list[list[int]]):
    """Every rank creates every group (new_group is collective), then keeps its own."""
    made = [dist.new_group(ranks) for ranks in groups]
    index = next(i for i, ranks in enumerate(groups) if rank in ranks)
    return index, made[index], groups[index].index(rank)


def _calls_since(log: CallLog, first: int) -> list[tuple[str, str, str, int | None]]:
    return [(c["call"], c["phase"], c.get("group", "?"), c["numel"])
            for c in log.calls[first:]]


def _plain(value):
    """A tensor's copy; None; or, for anything else, what it is (for the message)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return None if value is None else f"a {type(value).__name__}"


def _params(module) -> dict[str, dict]:
    """Each parameter: its value, whether it owns its storage, its gradient (later)."""
    out = {}
    for name, p in module.named_parameters():
        own = p.untyped_storage().nbytes() <= p.numel() * p.element_size()
        out[name] = {"value": p.detach().clone(), "own_storage": own,
                     "requires_grad": p.requires_grad}
    return out


def _grads(module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.detach().clone()
            for name, p in module.named_parameters()}


def _backward(log, y, upstream, label: str) -> bool:
    """y.backward(upstream) when y is a tensor of upstream's shape that needs a gradient."""
    if not isinstance(y, torch.Tensor) or y.shape != upstream.shape or not y.requires_grad:
        return False
    with log.recording():
        log.set_phase(f"{label}: backward")
        (y * upstream).sum().backward()  # y.backward(upstream) would import sympy (1 s)
    return True


def _linear(weight, bias) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer



def tp_linear_rank(rank, world_size, classes, data, log_dir):
    """The four classes on this rank's group: CopyToTP and ReduceFromTP alone, then each layer
    built from a full nn.Linear, with and without bias. Returns, per check, what came out (the
    output, the input's gradient, the parameters and their gradients) and the calls made."""
    copy_to_tp, reduce_from_tp, column_class, row_class = classes
    g, group, me = _join_groups(rank, data["groups"])
    log = GroupLog(log_path(log_dir, rank), group)
    results = {}

    # f: the same x on every rank of the group, a different output gradient on each
    x = data["copy_x"][g].clone().requires_grad_()
    first = len(log.calls)
    log.set_phase("case: CopyToTP")
    with log.recording():
        log.set_phase("CopyToTP: forward")
        y = copy_to_tp.apply(x, group)
    _backward(log, y, data["copy_upstream"][g][me], "CopyToTP")
    results["copy"] = {"y": _plain(y), "x_grad": _plain(x.grad), "calls": _calls_since(log, first)}

    # g: a different partial x on each rank, the same output gradient on each
    x = data["reduce_x"][g][me].clone().requires_grad_()
    first = len(log.calls)
    log.set_phase("case: ReduceFromTP")
    with log.recording():
        log.set_phase("ReduceFromTP: forward")
        y = reduce_from_tp.apply(x, group)
    _backward(log, y, data["reduce_upstream"][g], "ReduceFromTP")
    results["reduce"] = {"y": _plain(y), "x_grad": _plain(x.grad),
                         "calls": _calls_since(log, first)}

    for case in data["layers"]:
        layer = case["layers"][g]
        for kind, layer_class in (("column", column_class), ("row", row_class)):
            results[(kind, case["label"])] = _layer_check(
                log, layer_class, kind, case["label"], layer, group, me, data["tp"])
    results["borrowed"] = list(log.borrowed)
    return results


def _layer_check(log, layer_class, kind: str, label: str, layer: dict, group, me: int,
                 tp: int) -> dict:
    name = "ColumnParallelLinear" if kind == "column" else "RowParallelLinear"
    first = len(log.calls)
    log.set_phase(f"case: {name}, {label}")
    full = _linear(layer["weight"], layer["bias"])
    with log.recording():
        log.set_phase(f"{name}(full, group), {label}")
        module = layer_class(full, group)
    params = _params(module) if isinstance(module, nn.Module) else None
    if not _agree(_shapes_right(params, layer, kind, tp)):  # the checker names the shape
        return {"module": type(module).__name__, "params": params, "skipped": True,
                "calls": _calls_since(log, first)}
    x = layer["x"]
    if kind == "row":  # this rank's block of input features, as the column layer leaves it
        per = x.shape[-1] // tp
        x = x[..., me * per:(me + 1) * per]
    x = x.clone().requires_grad_()
    with log.recording():
        log.set_phase(f"{name}.forward, {label}")
        y = module(x)
    upstream = layer["upstream"]
    if kind == "column":  # this rank's slice of the whole output's gradient
        per = upstream.shape[-1] // tp
        upstream = upstream[..., me * per:(me + 1) * per]
    ran = _backward(log, y, upstream, f"{name}, {label}")
    return {"module": type(module).__name__, "params": params, "y": _plain(y),
            "x_grad": _plain(x.grad), "grads": _grads(module) if ran and params is not None
            else None, "backward": ran, "skipped": False, "calls": _calls_since(log, first)}


def _shapes_right(params, layer: dict, kind: str, tp: int) -> bool:
    """The shard's weight and bias have the shapes of this rank's block."""
    if params is None or "weight" not in params:
        return False
    n_out, n_in = layer["weight"].shape
    weight = (n_out // tp, n_in) if kind == "column" else (n_out, n_in // tp)
    bias = None if layer["bias"] is None else (n_out // tp if kind == "column" else n_out,)
    got_bias = tuple(params["bias"]["value"].shape) if "bias" in params else None
    return tuple(params["weight"]["value"].shape) == weight and got_bias == bias


def _agree(mine: bool) -> bool:
    """True when every rank says True. A shard of the wrong shape on one rank would make its
    forward fail there while the others wait for it in a collective: all skip instead."""
    flag = torch.tensor([1 if mine else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # the checker's own, on the whole world
    return bool(flag.item())



def tp_mlp_rank(rank, world_size, tpmlp_class, data, log_dir):
    """For each case: TPMLP(mlp, group) around a FeedForward with the case's weights, forward in
    training mode with the case's seed (so that dropout draws the reference's mask), backward
    with the case's output gradient. Returns the parameters, output, gradients and calls."""
    from gpulab.models import FeedForward, GPTConfig

    g, group, me = _join_groups(rank, data["groups"])
    log = GroupLog(log_path(log_dir, rank), group)
    results = []
    for case in data["cases"]:
        mlp = FeedForward(GPTConfig(n_embd=case["n_embd"], dropout=case["dropout"]))
        mlp.load_state_dict(case["state"][g])
        first = len(log.calls)
        log.set_phase(f"case: {case['label']}")
        with log.recording():
            log.set_phase(f"TPMLP(mlp, group), {case['label']}")
            module = tpmlp_class(mlp, group)
        params = _params(module) if isinstance(module, nn.Module) else None
        if isinstance(module, nn.Module):
            module.train()
        x = case["x"][g].clone().requires_grad_()
        torch.manual_seed(case["seed"])  # the reference's dropout mask, drawn the same way
        with log.recording():
            log.set_phase(f"TPMLP.forward, {case['label']}")
            y = module(x)
        ran = _backward(log, y, case["upstream"][g], f"TPMLP, {case['label']}")
        results.append({"module": type(module).__name__, "params": params, "y": _plain(y),
                        "x_grad": _plain(x.grad),
                        "grads": _grads(module) if ran and params is not None else None,
                        "backward": ran, "calls": _calls_since(log, first),
                        "borrowed": list(log.borrowed)})
    return results



def sp_block_rank(rank, world_size, block_class, data, log_dir):
    """SPBlock(block, group) around a Block with the group's weights, forward on this rank's
    T / tp_size tokens of the group's input, backward with the same tokens of the output's
    gradient, then sync_replicated_grads(). Each stage's calls are recorded in a phase of its
    own: "init", "forward", "backward", "sync"."""
    from gpulab.models import Block, GPTConfig

    g, group, me = _join_groups(rank, data["groups"])
    log = GroupLog(log_path(log_dir, rank), group)
    block = Block(GPTConfig(**data["config"]))
    block.load_state_dict(data["state"][g])
    with log.recording():
        log.set_phase("init: SPBlock(block, group)")
        module = block_class(block, group)
    params = _params(module) if isinstance(module, nn.Module) else None
    mine = slice(me * data["tokens"], (me + 1) * data["tokens"])  # this rank's tokens
    x = data["x"][g][:, mine].clone().requires_grad_()
    y, ran, synced, error = None, False, False, None
    try:  # a shard of the wrong shape fails alike on every rank: the checker names the shard
        with log.recording():
            log.set_phase("forward: SPBlock.forward")
            y = module(x)
        ran = _backward(log, y, data["upstream"][g][:, mine], "SPBlock")
        synced = ran and callable(getattr(module, "sync_replicated_grads", None))
        if synced:
            with log.recording():
                log.set_phase("sync: SPBlock.sync_replicated_grads")
                module.sync_replicated_grads()
    except Exception as raised:  # noqa: BLE001 - the learner's code: reported, graded after
        error = _where_raised(raised)
    return {"module": type(module).__name__, "params": params, "y": _plain(y),
            "x_grad": _plain(x.grad), "backward": ran, "synced": synced, "error": error,
            "grads": _grads(module) if ran and params is not None else None,
            "calls": _calls_since(log, 0), "borrowed": list(log.borrowed)}


def _where_raised(error: Exception) -> str:
    """The error and the last line of the notebook's code it passed through."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if "ipykernel" in f.filename
              or f.filename.startswith("<")]
    line = f" (in {frames[-1].name}: {frames[-1].line})" if frames else ""
    return f"{type(error).__name__}: {str(error)[:300]}{line}"
