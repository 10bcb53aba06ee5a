"""Lab 5's checkers for Parts 1-3 pass the lab's answers and fail, with the message that teaches,
on the wrong versions learners write: f without its backward all-reduce, g without its forward
all-reduce, the row layer's bias added on every rank, columns kept instead of rows, the default
group instead of the one passed in, the world's rank instead of the group's, an MLP that gathers
its hidden layer; and for 1F1B: GPipe, a warm-up one too long or too short, a backward before
its forward, a missing backward, m < p without the min, gpulab's own order.

The right code is the lab's answer cells (from solutions/), run in a fresh `__main__` (so that
it travels to the ranks by value, as a notebook's code does); each wrong version is the same
code with one change.
Each tensor-parallel check is one launch of 2 (or 4) processes; the schedule checks need none.
"""

import dataclasses
import re
import types
from pathlib import Path

import nbformat
import pytest
from grading_specs import LAB5 as SPEC
from lab_submissions import Lab, cell_by_grade_id
from torch import nn

from gpulab.checks.keys import answer_key
from gpulab.checks.lab5 import (
    check_cloud_job,
    check_interleaved,
    check_one_f_one_b,
    check_tp_linear,
    check_tp_mlp,
)
from gpulab.checks.lab5 import ranks as lab5_ranks
from gpulab.checks.lab5 import tp_linear as lab5
from gpulab.checks.lab5.cloud_job import SCENARIO, job_preemptions_per_hour, limits
from gpulab.checks.lab5.shared import RankView, layout, require_function
from gpulab.checks.quiz.expected import max_spot_nodes
from gpulab.cloud_cost import estimate_run, young_checkpoint_interval
from gpulab.distributed.schedule import one_f_one_b_order
from gpulab.distributed.tensor_parallel import ColumnParallelLinear as LibraryColumn
from gpulab.distributed.tensor_parallel import _CopyToTP

pytestmark = pytest.mark.lab5
REPO = Path(__file__).resolve().parents[1]
CELL_FILE = "/tmp/ipykernel_0/cell.py"  # where a kernel's cells say they come from

IMPORTS = """
import copy

import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
"""
SOLUTION = Lab("lab5_parallelism_across_nodes").solution()
ANSWERS = "\n\n".join(cell_by_grade_id(SOLUTION, grade_id).source
                      for grade_id in ("tp_linear", "tp_mlp", "one_f_one_b"))
ONE_F_ONE_B = cell_by_grade_id(SOLUTION, "one_f_one_b").source


def notebook(changes=(), extra: str = "") -> types.ModuleType:
    """The solution's answer cells, run in a fresh module named __main__ (as a kernel runs
    them), with `changes`: (old, new) replacements, each of a text found exactly once; then
    `extra`."""
    source = ANSWERS
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} is not once in the answers: update this test"
        source = source.replace(old, new)
    module = types.ModuleType("__main__")
    for cell in (IMPORTS, source, extra):
        exec(compile(cell, CELL_FILE, "exec"), module.__dict__)
    return module


def layers(nb) -> tuple:
    return nb.CopyToTP, nb.ReduceFromTP, nb.ColumnParallelLinear, nb.RowParallelLinear


def fails(check, *args, match: str, **kwargs) -> str:
    with pytest.raises(AssertionError) as error:
        check(*args, **kwargs)
    assert re.search(match, str(error.value), re.S), str(error.value)
    return str(error.value)


# ----------------------------------------------------------------------------- Parts 1-2


@pytest.mark.dist
def test_the_answers_pass_the_visible_and_the_hidden_tests():
    nb = notebook()
    check_tp_linear(*layers(nb), tp=2)
    check_tp_linear(*layers(nb), tp=2, world_size=4, seed=3)  # strided subgroups [0, 2], [1, 3]
    check_tp_mlp(nb.TPMLP, tp=2)


GATHERING_MLP = '''
class TPMLP(nn.Module):
    """Gathers the hidden units, then runs the whole proj on every rank."""

    def __init__(self, mlp, group):
        super().__init__()
        self.group = group
        self.fc = ColumnParallelLinear(mlp.fc, group)
        self.proj = copy.deepcopy(mlp.proj)
        self.drop = copy.deepcopy(mlp.drop)

    def forward(self, x):
        h = F.gelu(self.fc(x))
        parts = [torch.empty_like(h) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, h.contiguous(), group=self.group)
        parts[dist.get_rank(self.group)] = h
        return self.drop(self.proj(torch.cat(parts, -1)))
'''
WRONG_TP = {
    "f_without_backward_all_reduce": (
        [("        grad = grad.clone()  # autograd may hand this very tensor to another branch "
          "too\n        dist.all_reduce(grad, group=ctx.group)\n", "")], "", {},
        r"CopyToTP, rank 0: the input's gradient is wrong: it is this rank's own output "
        r"gradient, unchanged: CopyToTP's backward must all-reduce it"),
    "g_without_forward_all_reduce": (
        [("        dist.all_reduce(total, group=group)\n", "")], "", {},
        r"ReduceFromTP\.apply\(x, group\), rank 0: the output is wrong: it is this rank's own "
        r"partial, unchanged: ReduceFromTP's forward must all-reduce"),
    "row_bias_on_every_rank": (
        [("        y = ReduceFromTP.apply(F.linear(x, self.weight), self.group)  # g: sum the "
          "partials\n        return y if self.bias is None else y + self.bias  # once, after "
          "the sum\n", "        return ReduceFromTP.apply(F.linear(x, self.weight, self.bias), "
          "self.group)\n")], "", {},
        r"RowParallelLinear\.forward, a layer with bias, rank 0: the bias was added on every "
        r"rank before the sum: the output has tp_size = 2 times the bias"),
    "columns_instead_of_rows": (
        [("        per_rank = full.out_features // tp_size\n        rows = slice(tp_rank * "
          "per_rank, (tp_rank + 1) * per_rank)\n        self.weight = nn.Parameter(full.weight."
          "detach()[rows].clone())  # (out/tp, in)\n",
          "        per_rank = full.out_features // tp_size\n        rows = slice(tp_rank * "
          "per_rank, (tp_rank + 1) * per_rank)\n        per_in = full.in_features // tp_size\n"
          "        cols = slice(tp_rank * per_in, (tp_rank + 1) * per_in)\n        self.weight "
          "= nn.Parameter(full.weight.detach()[:, cols].clone())\n")], "", {},
        r"ColumnParallelLinear\(full, group\), a layer with bias, rank 0: self\.weight has shape "
        r"\(12, 4\), expected \(6, 8\): you kept columns \(input features\) instead of rows"),
    "default_group": (
        [("        dist.all_reduce(grad, group=ctx.group)\n", "        dist.all_reduce(grad)\n")],
        "", {}, r"CopyToTP, rank 0: dist\.all_reduce in CopyToTP: backward went to the default "
        r"group \(group=None: every rank of the world\)\. Pass the group you were given"),
    "world_rank_in_a_subgroup": (
        [("        tp_size, tp_rank = dist.get_world_size(group), dist.get_rank(group)\n        "
          "per_rank = full.out_features",
          "        tp_size, tp_rank = dist.get_world_size(group), dist.get_rank()\n        "
          "per_rank = full.out_features")], "", {"world_size": 4},
        r"ColumnParallelLinear\(full, group\), a layer with bias, rank 1 \(rank 0 of its group, "
        r"ranks \[1, 3\]\): self\.weight holds the wrong values: it holds the block of the "
        r"group's rank 1: this rank's place in its group is dist\.get_rank\(group\)"),
    "mlp_gathers_the_hidden_layer": (
        [], GATHERING_MLP, {"mlp": True},
        r"TPMLP, no dropout, rank 0: dist\.all_gather of \d+ elements in TPMLP\.forward: it "
        r"gathered the hidden activation\. Megatron's MLP needs no communication "
        r"between its two layers"),
}


@pytest.mark.dist
@pytest.mark.parametrize("name", WRONG_TP)
def test_a_wrong_tensor_parallel_layer_fails_with_its_message(name):
    changes, extra, kwargs, match = WRONG_TP[name]
    nb = notebook(changes, extra)
    if kwargs.pop("mlp", False):
        fails(check_tp_mlp, nb.TPMLP, tp=2, match=match)
    else:
        fails(check_tp_linear, *layers(nb), tp=2, **kwargs, match=match)


def test_borrowed_classes_earn_nothing_before_any_launch():
    nb = notebook()
    fails(check_tp_linear, _CopyToTP, nb.ReduceFromTP, nb.ColumnParallelLinear,
          nb.RowParallelLinear, match=r"CopyToTP is \(or extends\) gpulab's "
          r"gpulab\.distributed\.tensor_parallel\._CopyToTP")
    fails(check_tp_linear, nb.CopyToTP, nb.ReduceFromTP, LibraryColumn, nb.RowParallelLinear,
          match=r"ColumnParallelLinear is \(or extends\) gpulab's")
    fails(require_function, nb.ColumnParallelLinear, "CopyToTP",
          match=r"CopyToTP is not an autograd Function")
    fails(check_tp_mlp, lambda mlp, group: mlp, match=r"TPMLP is not a class")


def test_a_shard_that_is_a_view_of_the_whole_weight_is_refused():
    full = nn.Linear(8, 12)
    layer = {"weight": full.weight.detach(), "bias": full.bias.detach()}

    class Viewing(nn.Module):  # nn.Parameter of a slice shares the whole weight's storage
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(full.weight[:6])
            self.bias = nn.Parameter(full.bias[:6].clone())

    params = lab5_ranks._params(Viewing())
    assert not params["weight"]["own_storage"] and params["bias"]["own_storage"]
    shards = {"weight": layer["weight"][:6], "bias": layer["bias"][:6]}
    fails(lab5._check_shards, "ColumnParallelLinear", "rank 0", params, shards, layer, True, 2,
          RankView(0, [[0, 1]]), match=r"self\.weight is a view into the full layer's tensor.*"
          r"nn\.Parameter\(full\.weight\[\.\.\.\]\.clone\(\)\)")


def test_groups_are_strided_so_the_world_rank_is_never_the_group_rank():
    assert layout(2, None) == (2, [[0, 1]])
    assert layout(2, 4) == (4, [[0, 2], [1, 3]])
    assert str(RankView(3, [[0, 2], [1, 3]])) == "rank 3 (rank 1 of its group, ranks [1, 3])"
    with pytest.raises(ValueError):
        layout(3, 4)


# ----------------------------------------------------------------------------- Part 3


SIZES = [(4, 8), (2, 3), (3, 2), (5, 1), (1, 3), (4, 4), (6, 9)]  # visible and hidden


def test_the_answer_is_1f1b_for_every_size():
    stage = notebook().one_f_one_b_stage
    for p, m in SIZES:
        check_one_f_one_b(stage, p=p, m=m)
        assert [stage(p, m, s) for s in range(p)] == one_f_one_b_order(p, m)


def _with_warmup(rule: str) -> str:
    return ONE_F_ONE_B.replace("min(p - stage - 1, m)", rule)


WRONG_ORDERS = {
    "gpipe": ("def one_f_one_b_stage(p, m, stage):\n    return [('F', i) for i in range(m)] + "
              "[('B', i) for i in range(m)]", {},
              r"stage=0\) returned F0 F1 F2 F3 F4 F5 F6 F7 B0 .*That is GPipe: stage 0 holds "
              r"all m = 8 microbatches' activations before its first backward; 1F1B holds at "
              r"most p - stage = 4"),
    "gpipe_one_stage": ("def one_f_one_b_stage(p, m, stage):\n    return [('F', i) for i in "
                        "range(m)] + [('B', i) for i in range(m)]", {"p": 1, "m": 3},
                        r"That is GPipe: stage 0 holds all m = 3 .* at most p - stage = 1"),
    "warmup_p_minus_stage": (_with_warmup("min(p - stage, m)"), {},
                             r"stage=0\).*Its warm-up is 4 forwards, too many: then stage 0 "
                             r"holds 5 microbatches at once"),
    "warmup_too_short": (_with_warmup("max(min(p - stage - 2, m), 0)"), {},
                         r"stage=0\).*Its warm-up is 2 forwards, too few"),
    "warmup_without_min": (_with_warmup("p - stage - 1"), {"p": 4, "m": 2},
                           r"stage=0\).*Position 2, F2, names a microbatch that does not exist: "
                           r"there are m = 2 \(F0\.\.F1\)\. With m < p the warm-up is cut short.*"
                           r"1F1B on stage 0 of p = 4 with m = 2: 2 warm-up forwards"),
    "backward_first": (ONE_F_ONE_B.replace("    return order\n", "    order.remove(('B', 0))\n"
                                           "    return [('B', 0)] + order\n"), {},
                       r"It breaks a rule: stage 0 runs B0 \(position 0\) before F0 \(position "
                       r"1\): a stage can only run a microbatch's backward after its forward"),
    "missing_backward": (ONE_F_ONE_B.replace("    return order\n", "    return order[:-1]\n"),
                         {"p": 3, "m": 4}, r"stage=0\).*It breaks a rule: stage 0 never runs "
                         r"B3: every stage runs one forward and one backward of every microbatch"),
    "cool_down_reversed": (ONE_F_ONE_B.replace("range(m - warmup, m)]",
                                               "reversed(range(m - warmup, m))]"), {},
                           r"stage=0\).*Position 13 is B7; 1F1B runs B5 there"),
    "borrowed": ("from gpulab.distributed.schedule import one_f_one_b_order\n\n\n"
                 "def one_f_one_b_stage(p, m, stage):\n    return one_f_one_b_order(p, m)[stage]",
                 {}, r"ran gpulab's own code \(schedule\.py: one_f_one_b_order\)"),
    "a_generator": (ONE_F_ONE_B.replace("    return order\n", "    return iter(order)\n"), {},
                    r"returned list_iterator: return a list of \('F', i\) and \('B', i\) tuples"),
    "stub": ("def one_f_one_b_stage(p, m, stage):\n    raise NotImplementedError()", {},
             r"raised NotImplementedError\. Replace `raise NotImplementedError\(\)`"),
}


@pytest.mark.parametrize("name", WRONG_ORDERS)
def test_a_wrong_order_fails_with_its_message(name):
    code, kwargs, match = WRONG_ORDERS[name]
    fails(check_one_f_one_b, notebook(extra=code).one_f_one_b_stage, **kwargs, match=match)


def test_gpulabs_order_itself_earns_nothing():
    from gpulab.distributed import schedule

    fails(check_one_f_one_b, schedule.one_f_one_b_order, match=r"one_f_one_b_stage is gpulab's")


def test_lists_instead_of_tuples_are_accepted():
    stage = notebook().one_f_one_b_stage
    check_one_f_one_b(notebook(extra="""
_tuples = one_f_one_b_stage


def one_f_one_b_stage(p, m, stage):
    return [list(action) for action in _tuples(p, m, stage)]
""").one_f_one_b_stage)
    assert stage(2, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


# ----------------------------------------------------------------------------- Part 7

INTERLEAVED = cell_by_grade_id(SOLUTION, "interleaved").source


def interleaved(changes=(), code: str | None = None):
    """The answer's interleaved_stage with (old, new) `changes`, or `code` instead of it."""
    source = INTERLEAVED if code is None else code
    for old, new in changes:
        assert source.count(old) == 1, f"{old!r} is not once in the answer: update this test"
        source = source.replace(old, new)
    module = types.ModuleType("__main__")
    exec(compile(source, CELL_FILE, "exec"), module.__dict__)
    return module.interleaved_stage


def test_the_answer_meets_both_bounds_for_every_size():
    for p, m in ((4, 8), (2, 4), (3, 6), (4, 12), (1, 3)):
        check_interleaved(interleaved(), p=p, m=m)


@pytest.mark.dist
def test_the_answer_runs_on_ranks_with_the_whole_gpts_gradients():
    check_interleaved(interleaved(), p=2, m=4, on_ranks=True)
    check_interleaved(interleaved(), p=3, m=6, on_ranks=True, seed=2)


@pytest.mark.dist
def test_a_run_that_drops_a_gradient_is_named(monkeypatch):
    """The ranks' run is compared with the whole GPT: a rank that returns no gradient for a
    parameter (here, the embedding's) fails, naming it."""
    from gpulab.checks.lab5 import interleaved as checker

    real = checker.launch

    def without_embedding(*args, **kwargs):
        results = real(*args, **kwargs)
        for res in results:
            res["grads"].pop("embed.wte.weight", None)
        return results

    monkeypatch.setattr(checker, "launch", without_embedding)
    fails(check_interleaved, interleaved(), p=2, m=4, on_ranks=True,
          match=r"on 2 ranks, two chunks of a GPT on each: the gradient of embed\.wte\.weight "
                r"is wrong \(it is None")


WARMUP = "warmup = min(2 * (p - stage - 1) + (v - 1) * p, total)"
WRONG_INTERLEAVED = {
    "gpipe_over_chunks": (
        [], "def interleaved_stage(p, m, stage):\n    return [('F', i, c) for c in (0, 1) for i "
        "in range(m)] + [('B', i, c) for c in (1, 0) for i in range(m)]",
        r"holds 16 microbatch-chunks in flight on device 0, more than 11 = \(v \+ 1\) p - 1\. "
        r"That is GPipe's memory"),
    "warmup_too_long": (
        [(WARMUP, "warmup = min(2 * (p - stage - 1) + (v - 1) * p + 2, total)")], None,
        r"holds 13 microbatch-chunks in flight on device 0, more than 11"),
    "warmup_too_short": (
        [(WARMUP, "warmup = min(2 * (p - stage - 1), total)")], None,
        r"breaks a rule: stage 2 runs B0 \(chunk 1\) \(position 3\) before F0 \(chunk 1\)"),
    "same_warmup_on_every_device": (
        [(WARMUP, "warmup = min((v - 1) * p, total)")], None,
        r"leaves a bubble of 0\.692 of the stage-time idle; the bound is 0\.158 = \(p - 1\) / "
        r"\(v m \+ p - 1\), 1F1B's is 0\.273"),
    "both_chunks_of_a_microbatch_in_turn": (
        [("        chunk = within // p if kind == \"F\" else v - 1 - within // p\n"
          "        return (kind, group * p + within % p, chunk)",
          "        return (kind, k // 2, k % 2 if kind == \"F\" else 1 - k % 2)")], None,
        r"breaks a rule: the order deadlocks"),
    "gpulabs_own": (
        [], "from gpulab.distributed.schedule import interleaved_order\n\n\n"
        "def interleaved_stage(p, m, stage):\n    return interleaved_order(p, m, 2)[stage]",
        r"ran gpulab's own code \(schedule\.py: interleaved_order\).*earns no points"),
    "not_a_list": (
        [("    return order + [nth(k, \"B\") for k in range(total - warmup, total)]",
          "    return iter(order)")], None,
        r"returned list_iterator: return a list of \('F', i, chunk\) and \('B', i, chunk\)"),
}


@pytest.mark.parametrize("name", WRONG_INTERLEAVED)
def test_a_wrong_interleaved_schedule_fails_with_its_message(name):
    changes, code, match = WRONG_INTERLEAVED[name]
    fails(check_interleaved, interleaved(changes, code), p=4, m=8, match=match)


# ----------------------------------------------------------------------------- Part 5


def cloud_job(**changes):
    """The solution's cloud_job, its JobSpec with `changes` (dataclasses.replace)."""
    module = types.ModuleType("__main__")
    exec("from gpulab.distributed import JobSpec\n"
         "from gpulab.cloud_cost import young_checkpoint_interval", module.__dict__)
    exec(compile(cell_by_grade_id(SOLUTION, "cloud_job").source, CELL_FILE, "exec"),
         module.__dict__)
    spec = dataclasses.replace(module.cloud_job(), **changes)
    return lambda: spec


def test_the_answers_cloud_job_passes_with_the_limits_the_grader_computes():
    check_cloud_job(cloud_job())
    check_cloud_job(cloud_job(), need=answer_key("lab5.cloud_job"))
    assert answer_key("lab5.cloud_job")["max_interval_min"] == 90  # 2(f/λ - r) h: 2(1 - 0.25)


WRONG_CLOUD_JOBS = {  # and SPEC's image_too_new and checkpoints_hours_apart
    "one_process_per_node": ({"procs_per_node": 1}, r"One process per GPU: procs_per_node=8\. "
                             r"torchrun starts 2 x 1 = 2 processes for 16 GPUs"),
    "one_node": ({"nodes": 1}, r"Set nodes=2, the scenario's"),
    "other_machine": ({"machine_type": "a2-highgpu-8g"}, r"Set machine_type='a3-highgpu-8g'"),
    "on_demand": ({"spot": False}, r"Set spot=True"),
    "spot_without_restarts": ({"max_restarts": 0}, r"spot=True with max_restarts=0"),
    "cpu_image": ({"base_image": "pytorch/pytorch:latest"},
                  r"whose tag names its CUDA.*runs CUDA up to 12\.4"),
    "little_shm": ({"shm_gb": 4}, r"Give /dev/shm 16 GiB per node \(shm_gb\): 8 processes x 2 "
                   r"GiB.*--shm-size=4g"),
    "saves_too_often": ({"args": ("--checkpoint-every-min", "10")},
                        r"at least 40 minutes apart: .* every 10 spends 20\.0% of the time"),
    "no_interval": ({"args": ()}, r"Pass the checkpoint interval to the script"),
    # Young's interval for one VM's rate, sqrt(2c/0.025) = 98 minutes: fine for a 1-VM job.
    "one_vms_rate": ({"args": ("--checkpoint-every-min", "98")},
                     r"at most every 90 minutes: every 98 loses .* = 5\.3% .* fits one VM's "
                     r"rate, 0\.025/h; the job's is the sum over its 2 VMs, λ = 0\.05/h"),
}


@pytest.mark.parametrize("name", WRONG_CLOUD_JOBS)
def test_a_wrong_cloud_job_fails_with_its_message(name):
    changes, match = WRONG_CLOUD_JOBS[name]
    fails(check_cloud_job, cloud_job(**changes), match=match)


def test_lesson_01_the_quiz_and_lab_5_agree_on_a_jobs_preemption_rate():
    """Lesson 01 (section 8) teaches that a job's preemption rate is the sum over its machines;
    the quiz's q03 counts the nodes a loss bound allows with that rule; Lab 5's limits() bound
    the checkpoint interval. All three through gpulab.cloud_cost, on Lab 5's scenario."""
    lesson = nbformat.read(REPO / "lessons" / "01_gpu_architecture.ipynb", as_version=4)
    prose = " ".join(" ".join(cell.source for cell in lesson.cells).split())
    assert "The job's preemption rate is the sum over its machines." in prose
    need, scenario = limits(), SCENARIO
    job_rate = job_preemptions_per_hour()
    assert job_rate == scenario["nodes"] * scenario["preemptions_per_vm_hour"]
    longest_h, restart_h = need["max_interval_min"] / 60, scenario["restart_hours"]
    # Lesson 01's estimate_run, at Lab 5's longest interval: the job loses exactly the bound.
    run = estimate_run(100.0, 16, 1.0, job_rate, longest_h, restart_hours=restart_h)
    assert run.lost_hours / run.wall_hours == pytest.approx(scenario["max_loss_fraction"])
    # The quiz's q03, with Lab 5's numbers: a minute under that interval allows Lab 5's 2 VMs,
    # a minute over it only 1.
    for minutes, nodes in ((need["max_interval_min"] - 1, 2), (need["max_interval_min"] + 1, 1)):
        numbers = types.SimpleNamespace(
            preemptions_per_node_hour=scenario["preemptions_per_vm_hour"],
            checkpoint_minutes=minutes, restart_minutes=60 * restart_h,
            max_loss_percent=100 * scenario["max_loss_fraction"])
        assert max_spot_nodes(numbers) == nodes, minutes
    # The window of valid intervals is open and holds Young's interval for the job's rate.
    young_min = 60 * young_checkpoint_interval(scenario["save_minutes"] / 60, job_rate)
    assert need["min_interval_min"] + 20 <= young_min <= need["max_interval_min"] - 20


def test_a_cloud_job_that_is_not_a_jobspec_is_named():
    fails(check_cloud_job, lambda: {"nodes": 2}, match=r"cloud_job\(\) returned dict: return a "
          r"gpulab\.distributed\.JobSpec")


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.dist
@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message. Part 4's test starts a 2-node
    cluster."""
    SPEC.expect_checker_teaches(mistake)
