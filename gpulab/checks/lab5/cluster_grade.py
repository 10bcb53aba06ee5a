"""Grading one case of Lab 5's cluster check (pp_tp_cluster.py): each rank's stage, its order, its
MLP shards, the loss and every gradient against the whole GPT in one process. Every failure is
an AssertionError that says what is wrong and where to look; a pass returns a one-line summary.

    reference(gpt, x, y)                       the single-process loss and gradients
    grade_case(per_rank, reference, gpt, grid, case, "TPMLP")   -> summary line

A shard is identified by its values, not its name: the step changes no weight, so rank r's
fc.weight equals a block of rows of the GPT's fc.weight, and its gradient must equal the same
block of the full gradient (proj.weight: a block of columns; proj's bias: whole).
"""

from __future__ import annotations

import copy
import math

import torch

from gpulab.distributed.groups import RankGrid
from gpulab.distributed.pipeline_split import split_gpt
from gpulab.distributed.schedule import gpipe_order, one_f_one_b_order
from gpulab.train import cross_entropy

LOSS_RTOL = 1e-5  # fp32, summed in another order (microbatches, TP partial sums)
GRAD_RTOL = 1e-4  # of the largest entry of the full gradient; the right code: < 5e-6


def reference(gpt, x, y, proj_bias_times: float = 1.0) -> dict:
    """Loss and gradients of the whole GPT on the whole batch, in this process. With
    proj_bias_times != 1, each MLP's output bias counts that many times (a known mistake)."""
    model = copy.deepcopy(gpt)
    if proj_bias_times != 1.0:
        with torch.no_grad():
            for block in model.blocks:
                block.ff.proj.bias.mul_(proj_bias_times)
    loss = cross_entropy(model(x), y)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def _fail(label: str, text: str):
    raise AssertionError(f"check_pp_tp_cluster ({label}): {text}")


def where(grid: RankGrid, rank: int) -> str:
    _, pp_rank, tp_rank = grid.coords(rank)
    return f"rank {rank} (stage {pp_rank}, tp rank {tp_rank})"


def grade_case(per_rank: list[dict], ref: dict, gpt, grid: RankGrid, case: dict,
               tp_mlp_name: str) -> str:
    """AssertionError at the first thing wrong in this case; else a one-line summary."""
    m = case["n_microbatches"]
    label = f"n_microbatches={m}"
    stages = split_gpt(gpt, grid.pp_size)
    shards = []
    for rank, record in enumerate(per_rank):
        stage = grid.coords(rank).pp_rank
        _check_stage(record, stages[stage], rank, grid, label, tp_mlp_name)
        _check_order(record, rank, stage, grid, m, label)
        shards.append(_shard_map(record, gpt, rank, grid, label))
    _check_split(shards, grid, label)
    loss = check_loss(per_rank, ref, gpt, grid, case, label)
    n_grads = _check_grads(per_rank, shards, ref, grid, label)
    last = [r for r in range(grid.world_size) if grid.is_last_stage(r)]
    peaks = [per_rank[r]["peak_held"] for r in grid.pp_group_ranks(0)]
    return (f"{label}: loss {loss:.5f} on ranks {', '.join(map(str, last))} (one process, whole "
            f"batch: {ref['loss']:.5f}); all {n_grads} gradients on the {grid.world_size} ranks "
            f"match; each stage ran 1F1B, holding at most {peaks} microbatches (stage 0 first)")


def _check_stage(record, stage, rank, grid, label, tp_mlp_name) -> None:
    want_blocks = list(stage.blocks.keys())
    got_blocks = list(record["ff_types"])
    if got_blocks != want_blocks:
        _fail(label, f"{where(grid, rank)} returned a module with Blocks {got_blocks}; its "
                     f"stage holds Blocks {want_blocks}. Take split_gpt(gpt, pp_size)"
                     "[groups.coords.pp_rank], the stage of this rank's place in the pipeline.")
    for key, (type_name, is_ours) in record["ff_types"].items():
        if not is_ours:
            _fail(label, f"on {where(grid, rank)}, blocks.{key}.ff is a {type_name}, not your "
                         f"{tp_mlp_name}: replace each Block's MLP, block.ff = "
                         f"{tp_mlp_name}(block.ff, groups.tp).")
    want = {n for n, _ in stage.named_parameters() if ".ff." not in n}
    got = {n for n in record["values"] if ".ff." not in n}
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        _fail(label, f"{where(grid, rank)}'s module " + (
            f"lacks {missing[:3]}" if missing else f"has parameters the GPT has not: "
            f"{extra[:3]}") + ". Part 4 splits the MLPs only: the attention, layer norms, "
            "embedding and head stay as split_gpt made them (replicated on the TP ranks).")


def _check_order(record, rank, stage, grid, m, label) -> None:
    if record["order_calls"] == 0:
        _fail(label, f"pp_tp_step on {where(grid, rank)} never called your one_f_one_b_stage: "
                     "build the order with it, [one_f_one_b_stage(pp_size, n_microbatches, s) "
                     "for s in range(pp_size)].")
    ran = [tuple(a) for a in record["actions"]]
    want = one_f_one_b_order(grid.pp_size, m)[stage]
    if ran == want:
        return
    text = " ".join(f"{k}{i}" for k, i in ran)
    if ran == gpipe_order(grid.pp_size, m)[stage]:
        _fail(label, f"stage {stage} ran GPipe's order ({text}): the results are the same, but "
                     "Part 4 runs 1F1B, which holds fewer microbatches. Pass run_pipeline the "
                     "orders of your one_f_one_b_stage.")
    _fail(label, f"stage {stage} ran {text}; 1F1B on stage {stage} of {grid.pp_size} with "
                 f"{m} microbatches is {' '.join(f'{k}{i}' for k, i in want)}. Check "
                 "one_f_one_b_stage (Part 3), and that each stage gets its own list.")


def _candidates(ff, tp_size: int, prefix: str) -> list[tuple[str, tuple, int | None]]:
    """(full parameter name, index into it, block number or None for whole) of every slice a
    TP rank may hold."""
    out = []
    for r in range(tp_size):
        rows = slice(r * ff.fc.out_features // tp_size, (r + 1) * ff.fc.out_features // tp_size)
        out += [(f"{prefix}fc.weight", (rows,), r), (f"{prefix}fc.bias", (rows,), r),
                (f"{prefix}proj.weight", (slice(None), rows), r)]
    out += [(f"{prefix}{n}", (), None) for n, _ in ff.named_parameters()]
    return out


def _shard_map(record, gpt, rank, grid, label) -> dict:
    """{learner's name: (full name, index, block number)} for every MLP parameter of a rank."""
    shards, full = {}, dict(gpt.named_parameters())
    for key in record["ff_types"]:
        ff, prefix = gpt.blocks[int(key)].ff, f"blocks.{key}.ff."
        candidates = _candidates(ff, grid.tp_size, prefix)
        for name, value in record["values"].items():
            if not name.startswith(prefix):
                continue
            match = next((c for c in candidates if full[c[0]][c[1]].shape == value.shape
                          and torch.equal(full[c[0]][c[1]], value)), None)
            if match is None:
                _fail(label, f"{where(grid, rank)}'s {name}, of shape {tuple(value.shape)}, is no "
                             f"block of the MLP's weights ({prefix}fc.weight is "
                             f"{tuple(ff.fc.weight.shape)}): TPMLP must copy this rank's block "
                             "of rows of fc and of columns of proj from the MLP it is given.")
            if match[2] is None and match[0].endswith(("fc.weight", "fc.bias", "proj.weight")):
                _fail(label, f"{where(grid, rank)} holds the whole {match[0]}: TPMLP must keep "
                             f"only this rank's 1/{grid.tp_size} of it.")
            shards[name] = match
        held = {c[0] for c in shards.values() if c[0].startswith(prefix)}
        for full_name, _ in ff.named_parameters():
            if prefix + full_name not in held:
                _fail(label, f"{where(grid, rank)}'s TPMLP in block {key} holds nothing of "
                             f"{prefix}{full_name}" + (
                                 ": RowParallelLinear keeps the whole bias and adds it once, "
                                 "after the sum." if full_name == "proj.bias" else "."))
    return shards


def _check_split(shards: list[dict], grid: RankGrid, label: str) -> None:
    """The ranks of each TP group hold different blocks: together, the whole MLP."""
    for group in grid.groups("tp"):
        held: dict[str, list[int]] = {}
        for rank in group:
            for full_name, _, block in shards[rank].values():
                if block is not None:
                    held.setdefault(full_name, []).append(block)
        for full_name, blocks in held.items():
            if sorted(blocks) != list(range(grid.tp_size)):
                _fail(label, f"ranks {group} hold blocks {blocks} of {full_name}: each rank of "
                             "the TP group keeps the block numbered by its rank in the group, "
                             "dist.get_rank(group), so that together they hold all of it.")


def _close(a: float, b: float, rtol: float = 1e-4) -> bool:
    return abs(a - b) <= rtol * abs(b)


def check_loss(per_rank, ref, gpt, grid, case, label) -> float:
    m, want = case["n_microbatches"], ref["loss"]
    last = [r for r in range(grid.world_size) if grid.is_last_stage(r)]
    losses = {r: sum(per_rank[r]["losses"]) / len(per_rank[r]["losses"]) for r in last
              if per_rank[r]["losses"]}
    for rank in last:
        if rank not in losses:
            _fail(label, f"{where(grid, rank)} is on the last stage but its result has no "
                         "loss: return run_pipeline's result itself.")
    values = sorted(set(losses.values()))
    got = losses[last[0]]
    if all(abs(v - want) <= LOSS_RTOL * abs(want) for v in values):
        return got
    said = ", ".join(f"rank {r}: {v:.6f}" for r, v in losses.items())
    text = f"the loss on the last stage is {said}; the whole GPT in one process: {want:.6f}. "
    tokens = case["x"].numel() // m
    if len(values) > 1 and not _close(values[0], values[-1], LOSS_RTOL):
        hint = ("The TP ranks of the last stage disagree: their MLPs' outputs differ. "
                "RowParallelLinear must all-reduce its partial sums over the TP group "
                "(ReduceFromTP's forward), so that every rank gets the whole output.")
    elif _close(got, want / m):
        hint = (f"That is the loss divided by m = {m}: run_pipeline already divides each "
                "microbatch's loss by m for the gradients; loss_fn returns the plain mean.")
    elif _close(got, want * tokens):
        hint = ("That is the sum over each microbatch's tokens: loss_fn must return the mean "
                "(cross_entropy, or F.cross_entropy with its default reduction).")
    elif _close(got, reference(gpt, case["x"], case["y"], grid.tp_size)["loss"], 1e-5):
        hint = (f"That is the loss with each MLP's output bias counted {grid.tp_size} times: "
                "RowParallelLinear adds its bias once, after the all-reduce, not on every rank "
                "before it.")
    else:
        hint = ("Check that your TPMLP's output equals mlp(x) (Part 2's check), and the "
                "microbatches: list(x.chunk(n_microbatches)) and the same for y, along the "
                "batch dimension, with cross_entropy as loss_fn.")
    _fail(label, text + hint)


def _check_grads(per_rank, shards, ref, grid, label) -> int:
    """Every gradient against the full one; the count of gradients compared."""
    bad, count = [], 0
    # A gradient that is zero in exact arithmetic (k_proj's bias: softmax ignores a shift that
    # every key shares) is round-off here: measure errors against the model's gradients too.
    floor = 1e-2 * max(float(g.abs().max()) for g in ref["grads"].values())
    for rank, record in enumerate(per_rank):
        for name, got in record["grads"].items():
            full_name, index, block = shards[rank].get(name, (name, (), None))
            full = ref["grads"][full_name]
            if got is None:
                _fail(label, f"{where(grid, rank)}'s {name} has no gradient: the backward never "
                             "reached it. Is it a parameter of the module that ran (not a "
                             "detached copy), and did every microbatch's backward run?")
            want, scale = full[index], max(float(full.abs().max()), floor)
            err = float((got - want).abs().max()) / scale
            count += 1
            if err > GRAD_RTOL:
                # got = times * want, when the mistake is a factor (residual ~ 0 then)
                times = float((got * want).sum() / (want * want).sum().clamp_min(1e-30))
                scaled = float((got - times * want).abs().max()) / scale < 10 * GRAD_RTOL
                bad.append((rank, name, err, times if scaled else math.nan, block is not None))
    if not bad:
        return count
    _fail(label, _grad_mistake(bad, per_rank, grid, floor))


def _grad_mistake(bad, per_rank, grid, floor) -> str:
    tp = grid.tp_size
    replicated_differ = []
    for group in grid.groups("tp"):
        first = per_rank[group[0]]["grads"]
        for name, grad in first.items():
            if ".ff." in name:
                continue
            for rank in group[1:]:
                other = per_rank[rank]["grads"][name]
                if float((grad - other).abs().max()) > GRAD_RTOL * max(
                        float(grad.abs().max()), floor):
                    replicated_differ.append((group, name))
                    break
    rank, name, err, times, _ = bad[0]
    first = f"{where(grid, rank)}'s {name} is off by {err:.1e} of its largest entry"
    if replicated_differ:
        group, name = replicated_differ[0]
        return (f"{len(bad)} gradients are wrong; the replicated parameters' gradients differ "
                f"between the TP ranks {group} (first: {name}), so each holds a partial sum. "
                "The gradient that leaves the MLP for its input must be all-reduced over the TP "
                "group: CopyToTP's backward (f), in ColumnParallelLinear's forward.")
    # The last MLP's gradient comes straight from the head: an extra all-reduce of its
    # output's gradient shows there as exactly tp_size times the right weight gradients.
    times_tp = [b for b in bad if b[4] and abs(b[3] - tp) < 1e-3 * tp]
    if times_tp:
        rank, name, err, _, _ = times_tp[0]
        return (f"{where(grid, rank)}'s {name} is {tp} times its right gradient (and "
                f"{len(bad)} gradients are wrong): the gradient of the MLP's output was summed "
                f"over the {tp} TP ranks, which all hold the whole of it already. "
                "ReduceFromTP's backward is the identity.")
    if all(abs(b[3] - bad[0][3]) < 1e-3 * abs(bad[0][3]) for b in bad):  # False for NaN
        return (f"every wrong gradient is {bad[0][3]:.4g} times the right one ({first}): check "
                "what scales the loss before backward.")
    stages = sorted({grid.coords(b[0]).pp_rank for b in bad})
    right = sorted(set(range(grid.pp_size)) - set(stages))
    return (f"{len(bad)} gradients are wrong, on stage(s) {stages}" + (
        f" (stage(s) {right} are right)" if right else "") + f"; the first: {first}. "
        "A stage whose gradients are wrong while the next stage's are right got a wrong "
        "gradient from it, or ran its own backward wrong: check your TP classes' backward "
        "passes (Part 1) and that each stage runs run_pipeline once, with every microbatch.")
