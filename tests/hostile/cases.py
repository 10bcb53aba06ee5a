"""The bank: hostile and broken submissions, as learners would write them, with their outcomes.

Fixture lab: `mean` (test_mean, 2 points) and `running_max` (test_running_max, 3 points), with
the lab's own checkers in a locked cell. Its answers are right unless a case changes them, so a
test that scores zero there is the grader's doing. Most tampering goes in a cell between the two
tests: test_mean must keep its points (graded before), test_running_max must lose them.
Lab 1 cases start from the release (stubs: every test fails fast) or the solution.
Lab 3 cases (graded by tests/test_grading_lab3.py) change the solution's ring, which runs on
processes of its own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import gpulab.checks

FULL = {"test_mean": 2.0, "test_running_max": 3.0}
SECOND_VOID = {"test_mean": 2.0, "test_running_max": 0.0}
BOTH_VOID = {"test_mean": 0.0, "test_running_max": 0.0}
LAB1_ZERO = dict.fromkeys(gpulab.checks.assignment("lab1_cuda_kernels").points, 0.0)
WRONG_RUNNING_MAX = "def running_max(xs):\n    return []  # wrong: lets the checker decide"
FROM_ZERO = ("def running_max(xs):\n    out, best = [], 0  # wrong when all are negative\n"
             "    for x in xs:\n        best = max(best, x)\n        out.append(best)\n"
             "    return out")
# What only the fixture's hidden tests contain: none of it may reach a learner's eyes.
FIXTURE_HIDDEN = ("[[5.0], [-1.0, 1.0, 4.0, 8.0]]", "secret-marker-7f3a", "[-3, -5, -1]",
                  "[9, 1, 4]", "HIDDEN TESTS")


@dataclass(frozen=True)
class Case:
    """One submission and the outcome grading must reach."""

    student_id: str
    attack: str  # what the learner tries, in a line
    code: str = ""  # a cell the learner adds ...
    after: str = "test_mean"  # ... after the cell with this grade_id (or cell id)
    answers: dict[str, str] = field(default_factory=dict)  # answer grade_id -> its new source
    edit: tuple[str, str] | None = None  # ("delete" | "duplicate" | "forge", grade_id)
    raw: bytes | None = None  # the file handed in, when it is not a notebook
    lab: str = "lab0_fixture"
    base: str = "solution"  # or "release" (Lab 1)
    # The outcome.
    scores: dict[str, float] | None = None  # test grade_id -> points
    flags: tuple[str, ...] = ()  # each a part of some flag; none expected when empty
    reasons: tuple[tuple[str, str], ...] = ()  # (cell, part of its reason)
    error: str | None = None  # not graded: part of the error


def voided(cell: str) -> tuple[tuple[str, str], ...]:
    """The reason a test that was not run gets (its finding is in the flags)."""
    return ((cell, "IntegrityError before this test"),)


INTEGRITY = [
    Case("ada", "nothing: the lab's own solution", scores=FULL),
    Case("ast_pass", "an AST transformer that turns asserts into pass and drops checker calls",
         code='''
import ast


class NoChecks(ast.NodeTransformer):
    """Asserts become `pass`, checker calls vanish: no test can fail."""

    def visit_Assert(self, node):
        return ast.Pass()

    def visit_Expr(self, node):
        call = node.value
        named = isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        return None if named and call.func.id.startswith("check_") else node


get_ipython().ast_transformers.append(NoChecks())
''', answers={"running_max": WRONG_RUNNING_MAX}, scores=SECOND_VOID,
         flags=("tampered: ast_transformers",),
         reasons=voided("test_running_max")),
    Case("input_tf", "an input transformer that deletes the test cells' checker lines", code='''
def drop_checks(lines):
    """Runs on every cell's text before IPython compiles it."""
    return [line for line in lines if "check_" not in line]


get_ipython().input_transformers_cleanup.append(drop_checks)
''', answers={"running_max": WRONG_RUNNING_MAX}, scores=SECOND_VOID,
         flags=("input_transformers_cleanup",),
         reasons=voided("test_running_max")),
    Case("tracer", "a sys.settrace hook that could rewrite the tests' locals", code='''
import sys


def tracer(frame, event, arg):
    return tracer


sys.settrace(tracer)
''', scores=SECOND_VOID, flags=("sys.settrace hook",),
         reasons=voided("test_running_max")),
    Case("isinstance", "builtins.isinstance patched to say yes to numbers", code='''
import builtins

_isinstance = builtins.isinstance


def lenient(obj, kinds):
    return True if kinds in (int, float) else _isinstance(obj, kinds)


builtins.isinstance = lenient
''', scores=SECOND_VOID, flags=("builtins.isinstance",),
         reasons=voided("test_running_max")),
    Case("own_checker", "the lab's checker redefined in the notebook", code='''
def check_running_max(fn, cases):
    """Always happy."""
''', answers={"running_max": WRONG_RUNNING_MAX}, scores=SECOND_VOID,
         flags=("check_running_max (set by the lab)",)),
    Case("abs", "a builtin the lab's checker uses, shadowed in the notebook", after="mean",
         code='''
def abs(x):  # check_mean passes when abs(got - want) is small
    return 0
''', answers={"mean": "def mean(xs):\n    return 42"}, scores=BOTH_VOID,
         flags=("abs (used by check_mean)",)),
    Case("assertion", "builtins.AssertionError replaced", code='''
import builtins


class Relaxed(Exception):
    """Not an AssertionError."""


builtins.AssertionError = Relaxed
''', scores=SECOND_VOID, flags=("builtins.AssertionError",)),
    Case("hook", "a pre_run_cell hook that prints each cell's source (the hidden tests)",
         after="mean", code='''
def show(info):
    print(info.raw_cell)


get_ipython().events.register("pre_run_cell", show)
''', scores=BOTH_VOID, flags=("pre_run_cell callbacks",)),
    Case("history", "In, _ih, %history, linecache and the last traceback printed at the end",
         after="test_running_max", code='''
import linecache
import sys

print(In)
print(_ih)
get_ipython().run_line_magic("history", "-n")
print([entry[2] for entry in linecache.cache.values()])
print(get_ipython()._last_traceback, sys.last_traceback)
''', answers={"running_max": FROM_ZERO}, scores=SECOND_VOID),
]

ROBUSTNESS = [
    Case("bea", "nothing: the lab's own solution", scores=FULL),
    Case("endless", "running_max never returns", answers={
        "running_max": "def running_max(xs):\n    while True:\n        pass"},
         scores=SECOND_VOID, flags=("timeout: test_running_max",),
         reasons=(("test_running_max", "ran past the time limit"),)),
    Case("stubborn", "running_max never returns and ignores the interrupt", answers={
        "running_max": ("def running_max(xs):\n    import time\n    while True:\n        try:\n"
                        "            time.sleep(0.05)\n        except KeyboardInterrupt:\n"
                        "            pass")},
         scores=SECOND_VOID, flags=("timeout: test_running_max",),
         reasons=(("test_running_max", "ignored the interrupt"),)),
    Case("hung_group", "running_max joins a two-rank process group whose other rank never comes",
         answers={"running_max": (
             "def running_max(xs):\n    import datetime\n\n    import torch.distributed as dist\n"
             "\n    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=2,"
             "\n                            timeout=datetime.timedelta(hours=1))\n"
             "    return xs")},
         scores=SECOND_VOID, flags=("timeout: test_running_max",),
         reasons=(("test_running_max", "ran past the"),)),
    Case("exits", "os._exit(1) in a cell after mean", after="mean",
         code="import os\n\nos._exit(1)",
         scores={"test_mean": 0.0, "test_running_max": 3.0}, flags=("kernel died",),
         reasons=(("cell 5", "exit status 1"),)),
    Case("segfault", "a segmentation fault inside running_max, called by the checker",
         answers={"running_max": "def running_max(xs):\n    import ctypes\n"
                                 "    return list(ctypes.string_at(0))  # reads address 0"},
         scores=SECOND_VOID, flags=("kernel died: test_running_max",),
         reasons=(("test_running_max", "SIGSEGV"),)),
    Case("flood", "2 GB printed by one cell", after="mean",
         code='for _ in range(2048):\n    print("x" * (1 << 20))',
         scores=FULL, flags=("output capped: cell 5",)),
    Case("deleted", "test_running_max deleted (and running_max wrong)",
         edit=("delete", "test_running_max"), answers={"running_max": FROM_ZERO},
         scores=SECOND_VOID, flags=("restored cell: test_running_max",)),
    Case("twice", "test_mean handed in twice", edit=("duplicate", "test_mean"),
         scores=FULL, flags=("duplicated cell: test_mean",)),
    Case("forged", "a test cell of the learner's own, worth 100 points",
         edit=("forge", "test_bonus"), scores=FULL, flags=("ignored cell metadata",)),
    Case("corrupt", "a notebook cut off in the middle", raw=b'{"cells": [{"cell_type": "co',
         error="invalid JSON", flags=("unreadable notebook",)),
    Case("not_nb", "valid JSON, but not a notebook", raw=b'{"hello": "world"}',
         error="not a notebook", flags=("unreadable notebook",)),
]

LAB2_ZERO = {t: 0.0 for t in ("test_to_device", "test_amp_step", "test_accumulate_gradients",
                              "test_resume", "test_memorize")}

LAB2 = [
    Case("lab2_ok", "nothing: the lab's own solution", lab="lab2_amp_training",
         scores={"test_to_device": 2.0, "test_amp_step": 4.0, "test_accumulate_gradients": 3.0,
                 "test_resume": 4.0, "test_memorize": 2.0}),
    Case("torch_equal", "torch.equal and Tensor.__eq__ patched so a stale resume looks exact",
         lab="lab2_amp_training", base="release", after="imports", code='''
torch.equal = lambda a, b: True
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
''', scores=LAB2_ZERO, flags=("torch.equal",)),
    Case("checker2", "the lab's check_amp_step replaced by a function that accepts anything",
         lab="lab2_amp_training", base="release", after="imports", code='''
import gpulab.checks.lab2

gpulab.checks.lab2.check_amp_step = lambda *args, **kwargs: None
''', scores=LAB2_ZERO, flags=("gpulab.checks.lab2.check_amp_step",)),
]

LAB1 = [
    Case("checker", "the lab's check_saxpy replaced by a function that accepts anything",
         lab="lab1_cuda_kernels", base="release", after="imports", code='''
import gpulab.checks.lab1

gpulab.checks.lab1.check_saxpy = lambda kernel, sizes=(), seed=0: None
''', scores=LAB1_ZERO, flags=("gpulab.checks.lab1.check_saxpy",),
         reasons=voided("test_saxpy")),
    Case("numpy", "numpy.isclose and gpulab.sim's race check patched", lab="lab1_cuda_kernels",
         base="release", after="imports", code='''
import gpulab.sim

np.isclose = lambda a, b, **kwargs: np.ones(np.broadcast(a, b).shape, dtype=bool)
gpulab.sim.check_no_races = lambda *args, **kwargs: None
''', scores=LAB1_ZERO, flags=("numpy.isclose", "gpulab.sim.check_no_races")),
    Case("always_equal", "Part 6 answered with an object equal to everything",
         lab="lab1_cuda_kernels", base="release", answers={"waves": '''
class AlwaysEqual:
    """Equal to whatever it is compared with."""

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


threads_per_block = blocks = blocks_per_sm = n_waves = AlwaysEqual()
'''}, scores=LAB1_ZERO, reasons=()),
    # The attack that once earned 16/16: a frozen spec sheet edited in place, so that the
    # checker's own sums agreed with answers made for a 250-SM GPU.
    Case("lab1_spec_edit", "the L4's spec sheet edited in place (250 SMs), Part 6 answered "
         "for it", lab="lab1_cuda_kernels", base="release", answers={"waves": '''
l4 = get_gpu("L4")
object.__setattr__(l4, "sms", 250)  # a frozen dataclass gives way to object.__setattr__
threads_per_block, blocks, blocks_per_sm = 96, 10417, 14
n_waves = math.ceil(blocks / (l4.sms * blocks_per_sm))  # 3 on this L4, 13 on the real one
'''}, scores=LAB1_ZERO, flags=("gpulab.gpu_specs.GPUS",), reasons=voided("test_waves")),
]

# Lab 3's cases change the ring of the release, its other parts left as stubs that fail at
# once: what they try happens in the ring's processes, and grading the whole lab for each would
# cost minutes for nothing more.
LAB3_ZERO = dict.fromkeys(gpulab.checks.assignment("lab3_ddp_from_scratch").points, 0.0)
# In the command line of every process the orphans case starts: none may outlive grading. One
# per test process: a second suite on the same machine (a shared CI runner) grades its own
# orphans case, whose processes are alive while it runs and are not this run's leftovers.
LAB3_ORPHAN_MARKER = f"gpulab-lab3-orphan-{uuid.uuid4().hex[:12]}"

# Lab 3 runs the learner's ring on processes of its own (gpulab.distributed.run_on_ranks): what
# those do must not hang the grader, outlive it, or cost another part its points.
LAB3 = [
    Case("lab3_stubborn", "a ring that ignores SIGTERM and never returns",
         lab="lab3_ddp_from_scratch", base="release", answers={"ring_all_reduce": '''
def ring_all_reduce(tensor, op="sum"):
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's polite stop does nothing
    while True:
        time.sleep(0.1)
'''}, scores=LAB3_ZERO),
    Case("lab3_orphans", "a ring that leaves 20 sleeping children and a detached daemon behind",
         lab="lab3_ddp_from_scratch", base="release", answers={"ring_all_reduce": f'''
def ring_all_reduce(tensor, op="sum"):
    import os
    import subprocess

    if not os.environ.get("LEFT_BEHIND"):  # once per rank process
        os.environ["LEFT_BEHIND"] = "1"
        for _ in range(20):
            subprocess.Popen(["bash", "-c", "exec -a {LAB3_ORPHAN_MARKER} sleep 600"])
        subprocess.Popen(["bash", "-c", "(exec -a {LAB3_ORPHAN_MARKER}-daemon sleep 600 &)"],
                         start_new_session=True)  # its own session, its parent gone at once
    return tensor  # and the sum never computed
'''}, scores=LAB3_ZERO),
    Case("lab3_kills_kernel", "a ring that kills the kernel which launched it",
         lab="lab3_ddp_from_scratch", base="release", answers={"ring_all_reduce": '''
def ring_all_reduce(tensor, op="sum"):
    import os
    import signal

    parent = os.getppid()  # the fork server that started the rank (gloo), or the kernel
    with open(f"/proc/{parent}/cmdline", "rb") as line:
        if b"forkserver" in line.read():
            with open(f"/proc/{parent}/stat") as stat:  # its parent: the grading kernel
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(parent, signal.SIGKILL)
    return tensor
'''}, scores=LAB3_ZERO, flags=("kernel died",), reasons=(("cell 15", "SIGKILL"),)),
]

LAB4_FULL = {"test_diagnosis": 3.0, "test_fit_step": 5.0, "test_profile_reading": 3.0,
             "test_fast_results": 2.0, "test_fast_technique": 2.0, "test_speedup": 4.0}

# Lab 4 grades a speed-up with the clock and a fit with a memory budget: both live in the
# learner's process, so tampering with either must cost the part it would have bought.
LAB4 = [
    Case("lab4_kind_clock", "time.perf_counter replaced by a clock that stops inside fast_train",
         lab="lab4_memory_and_profiling", after="fast_train", code='''
import sys
import time

_real_clock = time.perf_counter


def _kind_clock():
    frame = sys._getframe(1)
    while frame is not None:  # no time passes while fast_train runs
        if frame.f_code.co_name == "fast_train":
            return 0.0
        frame = frame.f_back
    return _real_clock()


time.perf_counter = _kind_clock
''', scores={**LAB4_FULL, "test_fast_results": 0.0, "test_fast_technique": 0.0,
             "test_speedup": 0.0},
         flags=("time.perf_counter",), reasons=voided("test_fast_results")),
]

# The capstone compares the cluster's losses with a one-process reference, within a tolerance
# its checker module holds: loosening either before the tests must void them all. Both start
# from the release: the guard voids every test whatever the answers, so the solution's cluster
# runs would cost minutes for nothing more.
# The written answer, left as released, gets nbgrader's 0 (a person grades a written one).
CAPSTONE_VOID = {"test_sharded_training": 0.0, "test_memory_plan": 0.0,
                 "test_elastic_resume": 0.0, "test_preemption": 0.0,
                 "test_hang_diagnosis": 0.0, "written_answer": 0.0}
CAPSTONE = [
    Case("capstone_loose", "the checker's loss tolerance made infinite before any test",
         lab="capstone_distributed_gpt", base="release", after="shard_model", code='''
import gpulab.checks.capstone.sharded_training as capstone_checks

capstone_checks.loss_tolerance = lambda: float("inf")
''', scores=CAPSTONE_VOID, flags=("loss_tolerance",),
         reasons=voided("test_sharded_training")),
    Case("capstone_preset_edit", "the tiny preset edited in place (one Block), so that measured "
         "memory follows a smaller model", lab="capstone_distributed_gpt", base="release",
         after="shard_model",
         code='''
from gpulab.capstone.config import PRESETS

object.__setattr__(PRESETS["tiny"], "n_layer", 1)
''', scores=CAPSTONE_VOID, flags=("gpulab.capstone.config.PRESETS",),
         reasons=voided("test_sharded_training")),
]

# Lab 4's diagnosis is compared with numbers the grader measured outside the kernel: a scenario
# edited in place, with answers measured on it, voids the tests from there on. It starts from
# the release: the void takes every part after the first, so the solution's training would
# cost a minute for nothing more.
LAB4_ZERO = dict.fromkeys(LAB4_FULL, 0.0)
LAB4_DATA = [
    Case("lab4_scenario_edit", "the OOM scenario's model edited in place (one Block), Part A1 "
         "answered from its peak", lab="lab4_memory_and_profiling", base="release",
         answers={"diagnosis": '''
import sys

from gpulab.memory.measure import measure_step

scenario_module = sys.modules["gpulab.memory.oom_scenario"]
object.__setattr__(scenario_module.CONFIG, "n_layer", 1)
model, optimizer, x, y = scenario_module.oom_scenario().make()
peak = measure_step(model, (x, y), optimizer).breakdown
sizes = peak.as_dict()
DOMINANT_CATEGORY = max(sizes, key=sizes.get)
DOMINANT_SHARE = sizes[DOMINANT_CATEGORY] / peak.total
TIMES_MODEL_STATES = sizes[DOMINANT_CATEGORY] / (peak.parameters + peak.gradients
                                                 + peak.optimizer)
'''}, scores=LAB4_ZERO, flags=("gpulab.memory.oom_scenario.CONFIG",),
         reasons=voided("test_diagnosis")),
]

# The quiz's numbers come from the grader too: a recipe table edited in place, with q22
# answered from it, voids q22 and the questions after it. A classmate's notebook handed in as
# it is names its learner: it is not run, and scores zero.
QUIZ_FULL = {q: float(points) for q, points in gpulab.checks.assignment("quiz").points.items()}
QUIZ_ZERO = dict.fromkeys(QUIZ_FULL, 0.0)
QUIZ = [
    Case("quiz_recipe_edit", "bf16's bytes per parameter edited in place, q22 answered with "
         "them", lab="quiz", answers={"q22_answer": '''
import dataclasses

from gpulab.memory import recipes

recipes.RECIPES["bf16"] = dataclasses.replace(recipes.RECIPES["bf16"], param_itemsize=1)
per_param = model_states(1, "bf16", mine.q22.optimizer).total_bytes
q22 = (hw.get_gpu(mine.q22.gpu).memory_gb - mine.q22.reserved_gb) / per_param
'''}, scores={**QUIZ_FULL, "q22": 0.0, "q23": 0.0, "q24": 0.0, "q25": 0.0},
         flags=("gpulab.memory.recipes.RECIPES",), reasons=voided("q22")),
    Case("quiz_other_learner", "a classmate's notebook handed in as it is: its LEARNER is "
         "another student's id", lab="quiz", answers={"learner": 'LEARNER = "ada"'},
         scores=QUIZ_ZERO, flags=("learner mismatch: ada",)),
]
