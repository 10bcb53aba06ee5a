"""Lab 5, Part 4's checker: a GPT split 2 pipeline stages x 2 tensor-parallel ranks, one step on
a 2-node LocalCluster, against the same GPT in one process. The right code (below, written as a
solution would be) passes; wrong versions fail with the message that teaches: an MLP bias added
on every TP rank, a CopyToTP whose backward does not all-reduce, an all-reduce over the
default group (a hang, stopped); and, from what the ranks of a wrong run would save, the other
mistakes the grader names (GPipe's order, a loss divided by m twice, an extra all-reduce...).

Each wrong version is the right code's text with one change, run in a fresh module named
__main__ whose text sits in linecache, as a notebook kernel keeps its cells: the checker reads
the learner's sources from there. Each check that launches costs one cluster run (10-20 s), so
the launches are few: mistakes that need no ranks (a borrowed class, a source that cannot be
found) are caught before any launch.
"""

import copy
import inspect
import linecache
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpulab.checks.harness.owned import LIBRARY_DIR
from gpulab.checks.lab5 import cluster_grade as lab5_cluster_grade
from gpulab.checks.lab5 import pp_tp_cluster as lab5_cluster
from gpulab.checks.lab5.pp_tp_cluster import check_pp_tp_cluster, make_gpt
from gpulab.distributed import PipelineStage, RankGrid, run_pipeline, split_gpt
from gpulab.distributed import tensor_parallel as gpulab_tp
from gpulab.distributed.runtime.node_script import SourceNotFound, script_of
from gpulab.distributed.schedule import gpipe_order, one_f_one_b_order
from gpulab.train import cross_entropy

pytestmark = pytest.mark.lab5


# ---- the right code, as the solution notebook's answer cells write it --------------------------

class CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, group):
        super().__init__()
        self.group = group
        rows = full.out_features // dist.get_world_size(group)
        mine = slice(dist.get_rank(group) * rows, (dist.get_rank(group) + 1) * rows)
        self.weight = nn.Parameter(full.weight.detach()[mine].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[mine].clone())

    def forward(self, x):
        return F.linear(CopyToTP.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, full, group):
        super().__init__()
        self.group = group
        cols = full.in_features // dist.get_world_size(group)
        mine = slice(dist.get_rank(group) * cols, (dist.get_rank(group) + 1) * cols)
        self.weight = nn.Parameter(full.weight.detach()[:, mine].clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x_shard):
        y = ReduceFromTP.apply(F.linear(x_shard, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class TPMLP(nn.Module):
    def __init__(self, mlp, group):
        super().__init__()
        self.fc = ColumnParallelLinear(mlp.fc, group)
        self.proj = RowParallelLinear(mlp.proj, group)
        self.drop = copy.deepcopy(mlp.drop)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


def one_f_one_b_stage(p, m, stage):
    warmup = min(p - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def pp_tp_step(gpt, x, y, groups, n_microbatches):
    pp_size, pp_rank = groups.grid.pp_size, groups.coords.pp_rank
    module = split_gpt(gpt, pp_size)[pp_rank]
    for block in module.blocks.values():
        block.ff = TPMLP(block.ff, groups.tp)
    stage = PipelineStage(module, pp_rank, pp_size, group=groups.pp)
    order = [one_f_one_b_stage(pp_size, n_microbatches, s) for s in range(pp_size)]
    result = run_pipeline(stage, order, list(x.chunk(n_microbatches)),
                          list(y.chunk(n_microbatches)), cross_entropy)
    return module, result


GRADED = ("pp_tp_step", "TPMLP", "CopyToTP", "ReduceFromTP", "ColumnParallelLinear",
          "RowParallelLinear", "one_f_one_b_stage")
SOURCE = "import copy\n\n" + "\n\n".join(inspect.getsource(globals()[name]) for name in (
    "CopyToTP", "ReduceFromTP", "ColumnParallelLinear", "RowParallelLinear", "TPMLP",
    "one_f_one_b_stage", "pp_tp_step"))
IMPORTS = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
           "import torch.distributed as dist\n"
           "from gpulab.distributed import PipelineStage, run_pipeline, split_gpt\n"
           "from gpulab.train import cross_entropy\n")


def notebook(old: str = "", new: str = "", extra: str = "") -> types.ModuleType:
    """The right code with `old` (found exactly once) replaced by `new`, and `extra` cells
    first, run as a notebook runs cells: in a module named __main__, each cell's text kept in
    linecache under the cell's name."""
    source = SOURCE
    if old:
        assert source.count(old) == 1, f"{old!r} is not once in the right code: update the test"
        source = source.replace(old, new)
    module = types.ModuleType("__main__")
    for i, text in enumerate((IMPORTS, extra, source)):
        filename = f"/tmp/ipykernel_0/{i + 1}.py"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        exec(compile(text, filename, "exec"), module.__dict__)
    return module


def graded(module) -> list:
    return [getattr(module, name) if isinstance(module, types.ModuleType) else module[name]
            for name in GRADED]


def fails(module, match: str, **kwargs) -> str:
    with pytest.raises(AssertionError, match=match) as caught:
        check_pp_tp_cluster(*graded(module), **kwargs)
    return str(caught.value)


# ---- no launch ----------------------------------------------------------------------------------

def test_the_script_carries_the_sources_and_what_they_use():
    text = script_of({"pp_tp_step": pp_tp_step, "TPMLP": TPMLP}, "import torch\n")
    compile(text, "script.py", "exec")
    assert "import copy" in text and "from gpulab.distributed.pipeline import run_pipeline" in text
    # A class comes after the classes it names, so that each statement finds them.
    order = [text.index(f"class {name}(") for name in ("CopyToTP", "ColumnParallelLinear",
                                                        "TPMLP")]
    assert order == sorted(order) and text.index("def pp_tp_step(") > order[-1]
    assert "def one_f_one_b_stage(" in text and text.count("class CopyToTP(") == 1


def test_the_script_carries_the_notebooks_helpers_and_constants_but_not_its_data():
    helpers = ("import math as maths\nSCALE = 1.0\nx = torch.zeros(3)\n\n"
               "def mean_loss(out, target):\n    return cross_entropy(out, target) * SCALE\n")
    module = notebook("list(y.chunk(n_microbatches)), cross_entropy)",
                      "list(y.chunk(n_microbatches)), mean_loss)", extra=helpers)
    text = script_of({"pp_tp_step": module.pp_tp_step})
    assert "SCALE = 1.0" in text and "def mean_loss(" in text
    assert "from gpulab.train import cross_entropy" in text
    assert "\nx = " not in text and "maths" not in text  # a tensor, and a module nobody uses
    namespace = {"__name__": "script"}
    exec(compile(text, "script.py", "exec"), namespace)  # it runs on its own
    assert namespace["mean_loss"](torch.zeros(2, 3), torch.tensor([0, 1])) > 0


def test_code_made_by_exec_and_borrowed_classes_are_refused_before_any_launch():
    namespace = dict(globals())
    exec("def pp_tp_step(gpt, x, y, groups, n_microbatches):\n    return None\n", namespace)
    pieces = dict(zip(GRADED, graded(sys.modules[__name__]), strict=True))
    with pytest.raises(AssertionError, match="source of pp_tp_step .* cannot be found"):
        check_pp_tp_cluster(*graded({**pieces, "pp_tp_step": namespace["pp_tp_step"]}))
    with pytest.raises(SourceNotFound):
        script_of({"f": namespace["pp_tp_step"]})
    borrowed = {**pieces, "ColumnParallelLinear": gpulab_tp.ColumnParallelLinear}
    with pytest.raises(AssertionError, match="ColumnParallelLinear is .*gpulab's"):
        check_pp_tp_cluster(*graded(borrowed))


def test_a_bias_counted_twice_moves_the_loss_far_beyond_round_off():
    gpt, case = make_gpt(0, 2), CASE
    right = lab5_cluster_grade.reference(gpt, case["x"], case["y"])["loss"]
    twice = lab5_cluster_grade.reference(gpt, case["x"], case["y"], proj_bias_times=2)["loss"]
    assert abs(twice - right) > 100 * lab5_cluster_grade.LOSS_RTOL * right


GRID = RankGrid(1, 2, 2)
CASE = lab5_cluster._cases(4, seed=0)[0]


def _tp_index(name: str, tp_rank: int, tp_size: int, hidden: int) -> tuple:
    block = slice(tp_rank * hidden // tp_size, (tp_rank + 1) * hidden // tp_size)
    if ".ff.fc." in name:
        return (block,)
    return (slice(None), block) if name.endswith(".ff.proj.weight") else ()


def right_records(gpt, case=CASE, grid=GRID) -> list[dict]:
    """What the ranks of a right run save, made here from the one-process reference: each
    rank's stage, its MLP shards (rows of fc, columns of proj) and their gradients."""
    ref = lab5_cluster_grade.reference(gpt, case["x"], case["y"])
    full, m = dict(gpt.named_parameters()), case["n_microbatches"]
    hidden = gpt.blocks[0].ff.fc.out_features
    records = []
    for rank in range(grid.world_size):
        _, stage, tp_rank = grid.coords(rank)
        module = split_gpt(gpt, grid.pp_size)[stage]
        index = {n: _tp_index(n, tp_rank, grid.tp_size, hidden) for n, _ in
                 module.named_parameters()}
        records.append({
            "values": {n: full[n].detach()[i].clone() for n, i in index.items()},
            "grads": {n: ref["grads"][n][i].clone() for n, i in index.items()},
            "ff_types": {key: ("TPMLP", True) for key in module.blocks},
            "losses": [ref["loss"]] * m if grid.is_last_stage(rank) else [],
            "actions": one_f_one_b_order(grid.pp_size, m)[stage],
            "peak_held": min(grid.pp_size - stage, m), "order_calls": grid.pp_size})
    return records


def _grade(records, gpt) -> str:
    ref = lab5_cluster_grade.reference(gpt, CASE["x"], CASE["y"])
    return lab5_cluster_grade.grade_case(records, ref, gpt, GRID, CASE, "TPMLP")


def test_the_grader_passes_the_records_of_a_right_run():
    gpt = make_gpt(0, 2)
    summary = _grade(right_records(gpt), gpt)
    assert "n_microbatches=4: loss" in summary and "holding at most [2, 1]" in summary


def _scale_last_mlp(records, gpt, factor):  # the last Block's fc and proj weights, stage 1
    last = f"blocks.{len(gpt.blocks) - 1}.ff."
    for rank in (2, 3):
        for name in ("fc.weight", "fc.bias", "proj.weight"):
            records[rank]["grads"][last + name] *= factor
        records[rank]["grads"]["ln_f.weight"] += 1.0  # what flows on upstream is wrong too


def _shift(records, ranks, name, by=1.0):
    for rank in ranks:
        records[rank]["grads"][name] = records[rank]["grads"][name] + by


MISTAKES = {  # what a wrong run saves -> the message
    "gpipe_order": (lambda r, g: r[0].update(actions=gpipe_order(2, 4)[0]), "GPipe's order"),
    "order_not_theirs": (lambda r, g: r[1].update(order_calls=0),
                         "never called your one_f_one_b_stage"),
    "order_wrong": (lambda r, g: r[2].update(actions=[("F", 0), ("F", 1), ("B", 0), ("B", 1)]
                                             * 2), "1F1B on stage 1 of 2 with 4 microbatches"),
    "loss_over_m": (lambda r, g: [x.update(losses=[v / 4 for v in x["losses"]]) for x in r],
                    "divided by m = 4: run_pipeline already divides"),
    "loss_summed": (lambda r, g: [x.update(losses=[v * 16 for v in x["losses"]]) for x in r],
                    "sum over each microbatch's tokens"),
    "ranks_disagree": (lambda r, g: r[3].update(losses=[v + 0.1 for v in r[3]["losses"]]),
                       "TP ranks of the last stage disagree"),
    "mlp_not_replaced": (lambda r, g: r[0]["ff_types"].update({"0": ("FeedForward", False)}),
                         "blocks.0.ff is a FeedForward, not your TPMLP"),
    "whole_fc": (lambda r, g: r[1]["values"].update({"blocks.1.ff.fc.weight": g.blocks[1].ff.fc
                                                     .weight.detach().clone()}),
                 "holds the whole blocks.1.ff.fc.weight"),
    "same_block_twice": (lambda r, g: r[1]["values"].update({
        n: v for n, v in r[0]["values"].items() if ".ff." in n}), r"hold blocks \[0, 0\]"),
    "no_proj_bias": (lambda r, g: r[2]["values"].pop("blocks.3.ff.proj.bias"),
                     "holds nothing of blocks.3.ff.proj.bias: RowParallelLinear keeps"),
    "attention_split": (lambda r, g: r[0]["values"].update(
        {"blocks.0.attn.qkv.weight": torch.zeros(3)}), "splits the MLPs only"),
    "no_gradient": (lambda r, g: r[0]["grads"].update({"embed.wte.weight": None}),
                    "embed.wte.weight has no gradient"),
    "reduce_backward_all_reduces": (lambda r, g: _scale_last_mlp(r, g, 2.0),
                                    "is 2 times its right gradient.*ReduceFromTP's backward"),
    "copy_backward_partial": (lambda r, g: _shift(r, [0], "blocks.1.ln_2.weight"),
                              r"differ between the TP ranks \[0, 1\].*CopyToTP's backward"),
    "stage_0_wrong": (lambda r, g: _shift(r, [0, 1], "blocks.0.attn.q_proj.weight"),
                      r"on stage\(s\) \[0\] \(stage\(s\) \[1\] are right\)"),
    "all_halved": (lambda r, g: [x["grads"].update({n: v / 2 for n, v in x["grads"].items()})
                                 for x in r], "every wrong gradient is 0.5 times"),
}


@pytest.fixture(scope="module")
def right_run():
    gpt = make_gpt(0, 2)
    return gpt, right_records(gpt)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_the_grader_names_each_mistake_in_what_the_ranks_saved(name, right_run):
    gpt, records = right_run[0], copy.deepcopy(right_run[1])
    change, match = MISTAKES[name]
    change(records, gpt)
    with pytest.raises(AssertionError, match=match):
        _grade(records, gpt)


def test_a_failing_ranks_traceback_is_told_in_its_own_words():
    script = "/tmp/gpulab-lab5-x/pp_tp_train.py"
    trace = "\n".join([
        "Traceback (most recent call last):",
        f'  File "{script}", line 107, in <module>',
        "    rank_code.main(globals(), sys.argv[1], {})",
        f'  File "{script}", line 95, in pp_tp_step',
        "    stage = PipelineStage(module, 1, 2)",
        f'  File "{LIBRARY_DIR}/distributed/pipeline.py", line 133, in __init__',
        "    raise ValueError(",
        "ValueError: this rank is 0 of 2 in the pipeline's group, but was told it is stage 1"])
    result = types.SimpleNamespace(failed_rank=2, error=trace, returncode=1)
    text = lab5_cluster._rank_failure_text(result, Path("/tmp/gpulab-lab5-x"), GRID)
    assert text.startswith("pp_tp_step failed on rank 2 (pipeline stage 1, tp rank 0)")
    assert 'File "pp_tp_train.py", line 95, in pp_tp_step' in text
    assert "pipeline.py" not in text and "rank_code.main" not in text
    assert "groups.coords.pp_rank" in text  # the hint for this error


# ---- one launch each ----------------------------------------------------------------------------

@pytest.mark.dist
@pytest.mark.slow
def test_the_right_code_passes_with_several_microbatch_counts(capsys):
    check_pp_tp_cluster(*graded(sys.modules[__name__]), n_microbatches=(2, 8), seed=3)
    out = capsys.readouterr().out
    assert "RankGrid(dp_size=1, pp_size=2, tp_size=2): tp groups [0, 1] [2, 3]" in out
    assert "n_microbatches=2: loss" in out and "n_microbatches=8: loss" in out
    assert "holding at most [2, 1] microbatches" in out


WRONG = {
    "bias_on_every_rank": (
        "        y = ReduceFromTP.apply(F.linear(x_shard, self.weight), self.group)\n"
        "        return y if self.bias is None else y + self.bias",
        "        return ReduceFromTP.apply(F.linear(x_shard, self.weight, self.bias), self.group)",
        "bias counted 2 times"),
    "copy_without_all_reduce": (
        "        grad = grad.clone()\n        dist.all_reduce(grad, group=ctx.group)\n", "",
        r"differ between the TP ranks \[0, 1\].*CopyToTP's backward"),
}


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_version_fails_with_its_message(name):
    old, new, match = WRONG[name]
    fails(notebook(old, new), match)


@pytest.mark.dist
@pytest.mark.slow
def test_a_hang_is_stopped_and_says_where_each_rank_waited():
    text = fails(notebook("        dist.all_reduce(x, group=group)", "        dist.all_reduce(x)"),
                 "did not finish within 10 s", timeout_s=10.0)
    assert "waiting in all_reduce" in text and "`dist.all_reduce(x)`" in text
    assert "pass the TP group" in text
