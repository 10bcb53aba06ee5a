"""Lab 3 graded end to end, as an instructor grades it: autograder's grade and generate_feedback
on the cpu runner, in the sandbox (no network but its own loopback), with the repository's own
solution and release (labs/lab3_ddp_from_scratch, made by `python -m autograder release
lab3_ddp_from_scratch`). The lab's checkers start real processes from inside the grading kernel.

Nine learners hand in, graded in one batch: the full solution, the untouched release, the
solution with one part broken the way learners break it (MISTAKES: a string replacement in one
answer cell, found there exactly once), and Lab 3's cases of the hostile bank (tests/hostile):
a ring that ignores SIGTERM and never returns, one that leaves processes behind, one that kills
the kernel. Each mistake must cost exactly its part's points, with the checker's teaching
message in its feedback and no hidden test; each hostile case must end as the bank says, and
no process it started may outlive grading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from hostile import check_outcome, hand_in_all
from hostile.cases import LAB3, LAB3_ORPHAN_MARKER
from lab_submissions import Lab, Mistake, error_of, grade_id, page_text, read

from autograder.course import Course, repository_root
from autograder.feedback import generate_feedback
from autograder.grade import grade
from autograder.profiles import get_profile

pytestmark = [pytest.mark.lab3, pytest.mark.slow]

ROOT = repository_root()
LAB = "lab3_ddp_from_scratch"
NOTEBOOK = f"{LAB}.ipynb"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_ring_all_reduce": 6,
    "test_simple_ddp": 3,
    "test_fast_ddp": 7,
    "test_train_ddp": 4,
}
FULL_MARKS = 20
STUB_HINT = "Replace `raise NotImplementedError()` with your code."

MISTAKES = (
    Mistake("blocking_sends", "ring_all_reduce",
            "        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, "
            "left)]\n        for request in dist.batch_isend_irecv(ops):\n"
            "            request.wait()\n",
            "        dist.send(send, right)\n        dist.recv(recv, left)\n",
            "test_ring_all_reduce",
            r"did not finish within 20 s.*waiting in send to rank 1.*deadlocks: gloo's send "
            r"waits until the neighbour posts the matching receive"),
    Mistake("undivided", "simple_ddp",
            "            p.grad /= world_size  # the mean: the whole batch's gradient\n", "",
            "test_simple_ddp",
            r"the gradients are 2 times too big: they are the sum over the ranks\. Divide by "
            r"the world size \(2\)"),
    Mistake("no_overlap", "fast_ddp", "        self._launch_in_order(backward_done=False)\n", "",
            "test_fast_ddp",
            r"every bucket was all-reduced in finish_gradient_sync, after backward had "
            r"finished: nothing overlapped\. Launch each bucket from a gradient hook"),
    Mistake("same_order_every_epoch", "train_ddp",
            "        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank\n",
            "", "test_train_ddp",
            r"Every epoch went through the data in the same order: call "
            r"sampler\.set_epoch\(epoch\)"),
)


LAB3_SUB = Lab(LAB)
solution, released, with_mistake = LAB3_SUB.solution, LAB3_SUB.released, LAB3_SUB.with_mistake
hand_in, hidden_test_lines = LAB3_SUB.hand_in, LAB3_SUB.hidden_test_lines


# ----------------------------------------------------------------------------- one batch


@dataclass(frozen=True)
class Graded:
    results: dict  # student -> GradeResult
    scores: dict  # student -> {test grade_id: points}
    tests: dict  # student -> {test grade_id: the autograded test cell}
    feedback: dict  # student -> (the HTML page, its text)
    left_behind: list  # command lines of processes with the orphan marker, after grading


def orphans() -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if LAB3_ORPHAN_MARKER in line:
            found.append(line)
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    assert not orphans(), "processes of an earlier run are still alive"
    tmp = tmp_path_factory.mktemp("lab3")
    subs = tmp / "submissions"
    hand_in(subs, "solution", solution())
    hand_in(subs, "untouched", released())
    for mistake in MISTAKES:
        hand_in(subs, mistake.student_id, with_mistake(mistake))
    hand_in_all(subs, LAB3)

    course = Course.at(ROOT, tmp / "grading")
    results = grade(course, LAB, subs, get_profile("cpu"), progress=False, jobs=2)
    left_behind = orphans()
    print("seconds per submission:", {r.student_id: round(r.seconds) for r in results})
    errors = {r.student_id: r.error for r in results if not r.ok}
    assert not errors, f"the grader failed on: {errors}"
    pages = generate_feedback(course, LAB)

    scores, tests = {}, {}
    for result in results:
        scores[result.student_id] = {c.grade_id: c.auto_score for c in result.scores}
        nb = read(Path(result.autograded) / NOTEBOOK)
        tests[result.student_id] = {grade_id(c): c for c in nb.cells if grade_id(c) in POINTS}
    feedback = {}
    for page in pages:
        student = page.relative_to(course.grading / "feedback").parts[0]
        source = page.read_text()
        feedback[student] = (source, page_text(source))
    return Graded({r.student_id: r for r in results}, scores, tests, feedback, left_behind)


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB3_SUB.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB3_SUB.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    assert graded.scores["solution"] == POINTS
    assert not graded.results["solution"].flags


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    assert graded.scores["untouched"] == dict.fromkeys(POINTS, 0.0)
    for grade_id_, cell in graded.tests["untouched"].items():
        error = error_of(cell)
        assert error.ename == "AssertionError", grade_id_
        assert "raised NotImplementedError" in error.evalue and STUB_HINT in error.evalue


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    want = {test: 0.0 if test == mistake.test else float(points)
            for test, points in POINTS.items()}
    assert graded.scores[mistake.student_id] == want
    error = error_of(graded.tests[mistake.student_id][mistake.test])
    assert error.ename == "AssertionError"
    assert re.search(mistake.teaching, error.evalue, re.S), error.evalue


# ----------------------------------------------------------------------------- hostile rings


@pytest.mark.parametrize("case", LAB3, ids=lambda case: case.student_id)
def test_a_hostile_ring_costs_its_part_and_nothing_else(graded, case):
    check_outcome(case, graded.results[case.student_id])


def test_no_process_a_ring_started_outlives_grading(graded):
    error = error_of(graded.tests["lab3_orphans"]["test_ring_all_reduce"])
    assert "the tensor passed in is unchanged" in error.evalue, "the ring did not get to return"
    assert not graded.left_behind, f"left behind: {graded.left_behind[:3]}"


def test_a_ring_that_never_returns_is_stopped_and_explained(graded):
    error = error_of(graded.tests["lab3_stubborn"]["test_ring_all_reduce"])
    assert re.search(r"did not finish within 20 s, and every rank was stopped", error.evalue)


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    _, text = graded.feedback[mistake.student_id]
    assert re.search(mistake.teaching, text, re.S), f"{mistake.student_id}: no teaching"
    _, control = graded.feedback["solution"]  # the message comes from the failed test
    assert not re.search(mistake.teaching, control, re.S)


def test_no_feedback_page_shows_a_hidden_test(graded):
    hidden = hidden_test_lines()
    assert len(hidden) >= 5, "the lab's hidden tests were not found"
    students = {"solution", "untouched", *(m.student_id for m in MISTAKES),
                *(case.student_id for case in LAB3)}
    assert set(graded.feedback) == students
    for student, (page, text) in graded.feedback.items():
        assert "HIDDEN TESTS" not in page, student
        for line in hidden:
            assert line not in text, f"{student}'s feedback shows the hidden test {line!r}"
