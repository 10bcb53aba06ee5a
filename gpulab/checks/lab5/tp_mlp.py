"""Checker for Lab 5, Part 2 (solutions/lab5_parallelism_across_nodes/...): TPMLP, Megatron's
MLP (fc column-parallel, GELU, proj row-parallel), against the whole gpulab.models.FeedForward.

    check_tp_mlp(TPMLP, tp=2)       one launch: a case without dropout, one with it

On each rank, TPMLP(mlp, group) is built around a FeedForward (a GPT Block's MLP) with random
weights and biases, run forward in training mode (with the reference's seed, so that dropout
draws the same mask) and backward. The checker compares the shards it holds (this rank's rows of
fc, columns of proj, all of proj's bias), the output, the input's gradient and each shard's
gradient with the whole MLP's, and counts the collectives: exactly one all-reduce forward (g,
after proj) and one backward (f, before fc), none between the two layers.
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
    phase_kind,
    refuse_borrowed,
    run,
)

B, T = 2, 3
N_EMBD = 8  # C: the hidden layer has 4C = 32 units, split over tp_size ranks
CASES = (("no dropout", 0.0), ("dropout 0.25 in training mode", 0.25))


def _mlp(n_embd: int, dropout: float) -> nn.Module:
    from gpulab.models import FeedForward, GPTConfig

    return FeedForward(GPTConfig(n_embd=n_embd, dropout=dropout))


def _mlp_data(tp: int, groups, seed: int) -> dict:
    """Each case: per group, the MLP's weights (all random, biases too: a bias added twice
    must show), the input and the output's gradient."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for k, (label, dropout) in enumerate(CASES):
        states = []
        for _ in groups:
            mlp = _mlp(N_EMBD, dropout)
            with torch.no_grad():
                for p in mlp.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            states.append(mlp.state_dict())
        cases.append({"label": label, "dropout": dropout, "n_embd": N_EMBD, "state": states,
                      "seed": seed + 101 * k,
                      "x": [torch.randn(B, T, N_EMBD, generator=g) for _ in groups],
                      "upstream": [torch.randn(B, T, N_EMBD, generator=g) for _ in groups]})
    return {"groups": groups, "cases": cases}


def _reference(case: dict, g: int) -> dict:
    """The whole MLP on the group's input, with the same dropout mask as the ranks draw."""
    mlp = _mlp(case["n_embd"], case["dropout"])
    mlp.load_state_dict(case["state"][g])
    x = case["x"][g].clone().requires_grad_()
    with torch.random.fork_rng(devices=[]):  # the notebook's random state stays as it was
        torch.manual_seed(case["seed"])
        y = mlp(x)
    (y * case["upstream"][g]).sum().backward()  # as on the ranks
    with torch.no_grad():
        no_dropout = mlp.eval()(case["x"][g])
    return {"mlp": mlp, "y": y.detach(), "x_grad": x.grad, "no_dropout": no_dropout}


def check_tp_mlp(TPMLP, tp: int = 2, seed: int = 0, world_size: int | None = None) -> None:
    """TPMLP(mlp, group) on tp_size ranks (or world_size ranks in strided groups of tp): holds
    this rank's shards of fc and proj only; forward and backward equal the whole MLP's, with and
    without dropout; exactly one all-reduce forward and one backward, on the group passed in."""
    require_own_class(TPMLP, "TPMLP")
    world_size, groups = layout(tp, world_size)
    if 4 * N_EMBD % tp:
        raise ValueError(f"tp={tp} must divide the MLP's {4 * N_EMBD} hidden units")
    data = _mlp_data(tp, groups, seed)
    case = case_label(tp, world_size, groups)
    results = run(lab5_ranks.tp_mlp_rank, world_size, TPMLP, data, name="TPMLP", case=case)
    refuse_borrowed("TPMLP", results)
    views = [RankView(r, groups) for r in range(world_size)]
    for i, mlp_case in enumerate(data["cases"]):
        refs = [_reference(mlp_case, g) for g in range(len(groups))]
        for view in views:
            mates = [results[r][i]["y"] for r in view.ranks]
            _grade(results[view.rank][i], mlp_case["label"], refs[view.group], view, tp, mates)


def _shards(mlp: nn.Module, me: int, tp: int, grads: bool = False) -> dict[str, torch.Tensor]:
    """This rank's block of each of the MLP's parameters (or of their gradients)."""
    per = mlp.fc.out_features // tp
    rows = slice(me * per, (me + 1) * per)

    def of(p):
        return p.grad if grads else p.detach()

    return {"fc.weight": of(mlp.fc.weight)[rows], "fc.bias": of(mlp.fc.bias)[rows],
            "proj.weight": of(mlp.proj.weight)[:, rows], "proj.bias": of(mlp.proj.bias)}


def _grade(res: dict, label: str, ref: dict, view: RankView, tp: int, mates) -> None:
    where = f"{label}, {view}"
    check_groups("TPMLP", res["calls"], where)
    others = [(c, phase, numel) for c, phase, _, numel in res["calls"] if c != "all_reduce"
              and phase_kind(phase) != "init"]
    if others:
        call, phase, numel = others[0]
        gathered = "gather" in call
        raise AssertionError(
            f"TPMLP, {where}: dist.{call} of {numel} elements in {phase.split(', ')[0]}"
            + (": it gathered the hidden activation. " if gathered else ". ")
            + "Megatron's MLP needs no communication between its two layers: the column-"
            "parallel fc leaves each rank exactly the slice of the hidden units that its row-"
            "parallel proj takes, and GELU works element by element. One all-reduce forward "
            "(g, after proj) and one backward (f, before fc), nothing else.")
    if res["params"] is None:
        raise AssertionError(f"TPMLP(mlp, group) gave a {res['module']}, not an nn.Module: "
                             "define `class TPMLP(nn.Module):` and call super().__init__().")
    names = _match_shards(res["params"], _shards(ref["mlp"], view.me, tp), where)
    if not close(res["y"], ref["y"]):
        raise AssertionError(f"TPMLP.forward, {where}: {_output_mistake(res, ref, mates)}")
    if not close(res["x_grad"], ref["x_grad"]):
        twice = close(res["x_grad"], tp * ref["x_grad"]) if res["x_grad"] is not None else False
        raise AssertionError(
            f"TPMLP, {where}: the input's gradient is wrong ({err(res['x_grad'], ref['x_grad'])})"
            + (": tp_size times the right one, an all-reduce too many on the way back." if twice
               else ". It must be the whole MLP's: CopyToTP in front of fc all-reduces it."))
    want_grads = _shards(ref["mlp"], view.me, tp, grads=True)
    for key, mine in names.items():
        got = res["grads"].get(mine) if res["grads"] else None
        if got is None or not close(got, want_grads[key]):
            raise AssertionError(
                f"TPMLP, {where}: the gradient of {mine} (this rank's block of {key}) is wrong ("
                f"{'None' if got is None else err(got, want_grads[key])}); it should be the "
                f"matching block of the whole MLP's {key}.grad.")
    check_counts("TPMLP", res["calls"], where, forward=1, backward=1)


def _match_shards(params: dict, shards: dict, where: str) -> dict[str, str]:
    """Which of the learner's parameters holds each expected shard (by value); AssertionError
    when one is missing or something else is kept as well."""
    found = {}
    for key, want in shards.items():
        mine = next((n for n, p in params.items() if p["value"].shape == want.shape
                     and torch.equal(p["value"], want) and n not in found.values()), None)
        if mine is None:
            what = "all of proj.bias" if key == "proj.bias" else f"this rank's block of {key}"
            raise AssertionError(
                f"TPMLP(mlp, group), {where}: no parameter holds {what}, shape "
                f"{tuple(want.shape)}. fc is split by output features (this rank's rows of "
                "fc.weight and fc.bias), proj by input features (its columns of proj.weight, "
                "and the whole proj.bias): build them with your Part 1 layers.")
        found[key] = mine
    extra = [n for n in params if n not in found.values()]
    if extra:
        shapes = ", ".join(f"{n} {tuple(params[n]['value'].shape)}" for n in extra)
        raise AssertionError(
            f"TPMLP(mlp, group), {where}: it also holds {shapes}, beyond this rank's shards. "
            "Keep only the two parallel layers (and the dropout, which has no parameters), "
            "not the whole mlp: each rank is meant to hold 1/tp_size of its weights.")
    return found


def _output_mistake(res: dict, ref: dict, mates) -> str:
    got = res["y"]
    if not isinstance(got, torch.Tensor) or got.shape != ref["y"].shape:
        return f"the output is wrong: {err(got, ref['y'])}; it must be the whole MLP's (B, T, C)."
    if any(not torch.equal(got, other) for other in mates if isinstance(other, torch.Tensor)):
        return ("the ranks of the group returned different outputs. The output is summed over "
                "the group (g) and must be the same on every rank: apply the dropout to the sum, "
                "after the all-reduce, as FeedForward applies it after proj.")
    if not torch.equal(ref["y"], ref["no_dropout"]):  # this case has dropout; the other passed
        if close(got, ref["no_dropout"]):
            return ("in training mode it equals the MLP without dropout: apply the original's "
                    "dropout (mlp.drop, or a copy of it) to the output, as FeedForward does.")
        return (f"it differs from the whole MLP's only with dropout ({err(got, ref['y'])}): "
                "apply the dropout once, to the summed output (after proj, whose all-reduce "
                "comes first), as FeedForward does; the same seed then draws the same mask.")
    return (f"it differs from the whole MLP's ({err(got, ref['y'])}): fc column-parallel, GELU, "
            "proj row-parallel, then the dropout, exactly as FeedForward.forward.")
