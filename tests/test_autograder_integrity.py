"""Tampering with the test machinery earns nothing, and hidden tests never reach a learner.

The bank's integrity cases for the fixture lab (tests/hostile/cases.py) are graded here, one
sandboxed kernel per submission, and each case's outcome is asserted; the bank's cases for the
course's notebooks are graded in those notebooks' batches (tests/test_grading_<notebook>.py).
The quick tests below them pin the pieces: what the guard answers, how cells are planned, how
checkers treat a learner's object that claims to equal anything.
"""

import ast
import shutil
from dataclasses import replace
from pathlib import Path

import nbformat
import numpy as np
import pytest
from hostile import FIXTURE_HIDDEN, INTEGRITY, check_outcome, hand_in_all
from lab_submissions import ROOT, page_text

from autograder.cells import Plan
from autograder.course import Course
from autograder.execute import describe_exit
from autograder.feedback import generate_feedback, is_test_cell
from autograder.grade import grade
from autograder.integrity import check_expression, read_answer
from autograder.profiles import get_profile
from gpulab.checks.harness.numbers import as_number
from gpulab.checks.lab1 import WAVES_SETTING, check_waves
from gpulab.checks.lab1.waves import expected_waves

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"


@pytest.fixture(scope="module")
def fixture_batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    subs = hand_in_all(root / "subs", INTEGRITY)
    course = Course.at(root)
    profile = replace(get_profile("cpu"), cell_timeout_s=20)
    results = grade(course, LAB, subs, profile, progress=False)
    generate_feedback(course, LAB)
    return course, {result.student_id: result for result in results}


@pytest.mark.slow
@pytest.mark.parametrize("case", INTEGRITY, ids=lambda case: case.student_id)
def test_fixture_lab_outcome(fixture_batch, case):
    check_outcome(case, fixture_batch[1][case.student_id])


@pytest.mark.slow
@pytest.mark.parametrize("student", ["hook", "history", "ast_pass", "ada"])
def test_hidden_tests_reach_neither_the_notebook_nor_the_feedback(fixture_batch, student):
    """A hook that prints each cell's source, and a cell that prints In, _ih, %history, linecache
    and the last traceback: the learner's own cells show none of the hidden tests."""
    course, _ = fixture_batch
    folder = course.grading / "autograded" / student / LAB
    nb = nbformat.read(folder / f"{LAB}.ipynb", as_version=4)
    shown = [str(out) for cell in nb.cells if cell.cell_type == "code" and not is_test_cell(cell)
             for out in cell.outputs]
    page = page_text((course.grading / "feedback" / student / LAB / f"{LAB}.html").read_text())
    for secret in FIXTURE_HIDDEN:
        assert not any(secret in text for text in shown), f"{secret!r} in {student}'s outputs"
        assert secret not in page, f"{secret!r} in {student}'s feedback"


@pytest.mark.slow
def test_history_cell_ran_and_printed_the_learners_own_cells(fixture_batch):
    """The history case proves something only if its cell ran: it prints the learner's cells."""
    course, _ = fixture_batch
    nb = nbformat.read(course.grading / "autograded" / "history" / LAB / f"{LAB}.ipynb",
                       as_version=4)
    printed = "".join(out.get("text", "") for out in nb.cells[-1].outputs)
    assert "def running_max(xs)" in printed and "def mean(xs)" in printed


# ----------------------------------------------------------------------------- quick pieces


class AlwaysEqual:
    """A learner's object that says it equals whatever it is compared with."""

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def test_an_object_equal_to_everything_fails_the_checkers():
    with pytest.raises(AssertionError, match="should be a number"):
        as_number(AlwaysEqual(), "n_waves")
    with pytest.raises(AssertionError, match="threads_per_block should be a number"):
        check_waves(AlwaysEqual(), AlwaysEqual(), AlwaysEqual(), AlwaysEqual(),
                    want=expected_waves(**WAVES_SETTING))
    assert AlwaysEqual() == 3, "the object does fool a plain comparison"
    with pytest.raises(TypeError):  # and NumPy's comparisons refuse it
        np.isclose(np.array([AlwaysEqual()]), np.array([1.0]))


def test_the_guard_answer_must_carry_the_token():
    def reply(text):
        return {"status": "ok", "user_expressions": {
            "guard": {"status": "ok", "data": {"text/plain": text}}}}

    assert read_answer(reply("[('t1', ())]"), "t1") == []
    assert read_answer(reply("[('t1', ('sys.settrace hook',))]"), "t1") == ["sys.settrace hook"]
    assert read_answer(reply("[('t0', ())]"), "t1")[0].endswith("answer is not genuine")
    assert read_answer(reply("[('t1', ()), ('t1', ())]"), "t1")[0].endswith("not genuine")
    assert "unreadable" in read_answer(reply("[('t1', ("), "t1")[0]
    missing = {"status": "ok", "user_expressions": {"guard": {"status": "error",
                                                              "ename": "IndexError"}}}
    assert "missing or broken (IndexError" in read_answer(missing, "t1")[0]
    assert "could not run" in read_answer({"status": "error", "ename": "ValueError"}, "t1")[0]
    assert read_answer(None, "t1") == ["the kernel did not answer the integrity check"]


def test_the_check_expression_names_nothing_a_learner_can_rebind():
    """No variable, builtin or module: only its own loop variables and attributes of `()`."""
    tree = ast.parse(check_expression("t1", ("print",)), mode="eval")
    assert {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} == {"g", "c"}


def test_plan_knows_tests_setup_and_what_the_tests_read():
    nb = nbformat.read(FIXTURE / LAB / f"{LAB}.ipynb", as_version=4)
    plan = Plan.of(nb)
    roles = dict(zip(plan.labels, plan.roles, strict=True))
    assert roles["checkers"] == "setup" and roles["mean"] == "learner"
    assert roles["test_mean"] == roles["test_running_max"] == "test"
    setup = plan.labels.index("checkers")
    assert plan.protects == {setup: ("check_mean", "check_running_max")}
    assert {"check_mean", "mean"} <= set(plan.reads[plan.labels.index("test_mean")])
    assert plan.imports == plan.watch == (), "the fixture's tests import nothing"
    lab1 = Plan.of(nbformat.read(ROOT / "solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb",
                                 as_version=4))
    assert {"gpulab.checks.lab1", "gpulab.checks.keys", "gpulab.sim"} <= set(lab1.imports)
    assert {"gpulab.*", "numpy"} <= set(lab1.watch)  # every gpulab module, not a list
    assert lab1.data == ("gpulab.*",)  # and their data: spec sheets, recipes, tolerances
    quiz = Plan.of(nbformat.read(ROOT / "solutions/quiz/quiz.ipynb", as_version=4))
    # The modules the quiz's own setup cell imports are loaded (and watched) before any cell.
    assert {"gpulab.memory.recipes", "gpulab.distributed"} <= set(quiz.imports)


@pytest.mark.parametrize(("code", "words"), [
    (1, "exit status 1"), (-11, "killed by SIGSEGV (a segmentation fault)"),
    (137, "exit status 137: killed by SIGKILL"), (None, "it stopped answering"),
])
def test_a_dead_kernel_is_described_in_words(code, words):
    assert words in describe_exit(code)
