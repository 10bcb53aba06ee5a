"""Lab 2 graded end to end, as an instructor grades it: autograder's grade and generate_feedback on
the cpu runner, with the repository's own solution and release (labs/lab2_amp_training, made by
`python -m autograder release lab2_amp_training`).

Eight learners hand in, graded in one batch: the full solution, the untouched release, and the
solution with one part broken the way learners break it (MISTAKES: a string replacement in one
answer cell, which must be found there exactly once). Each mistake must cost exactly its part's
points, and its feedback must show the checker's teaching message and no hidden test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_submissions import Lab, Mistake, error_of, grade_id, page_text, read

from autograder.course import Course, repository_root
from autograder.feedback import generate_feedback
from autograder.grade import grade
from autograder.profiles import get_profile

pytestmark = [pytest.mark.lab2, pytest.mark.slow]

ROOT = repository_root()
LAB = "lab2_amp_training"
NOTEBOOK = f"{LAB}.ipynb"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_to_device": 2,
    "test_amp_step": 4,
    "test_accumulate_gradients": 3,
    "test_resume": 4,
    "test_memorize": 2,
}
FULL_MARKS = 15
STUB_HINT = "Replace `raise NotImplementedError()` with your code."


MISTAKES = (
    Mistake("blocking_copy", "to_device", "batch.to(device, non_blocking=True)",
            "batch.to(device)", "test_to_device",
            r"tensor copies were not asynchronous: call \.to\(device, non_blocking=True\)"),
    Mistake("step_without_update", "amp_step",
            "    scaler.update()  # halve the scale after a skip, grow it after a run of clean "
            "steps\n", "", "test_amp_step",
            r"the scale is still 1024 after the step, expected 2048: scaler\.update\(\) was not "
            r"called"),
    Mistake("clip_before_unscale", "amp_step",
            "        scaler.unscale_(optimizer)  # the true gradients, not S times them\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n",
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)\n"
            "        scaler.unscale_(optimizer)\n", "test_amp_step",
            r"clipped while still multiplied by the scale S = 1024.*Call "
            r"scaler\.unscale_\(optimizer\) before clip_grad_norm_"),
    Mistake("undivided_loss", "accumulate_gradients",
            " * (len(x) / n_total)  # this micro-batch's share", "", "test_accumulate_gradients",
            r"the sum of the micro-batches' mean gradients, about 3 times the batch's"),
    Mistake("forgotten_optimizer_state", "resume",
            '    optimizer.load_state_dict(snap["optimizer"])\n', "", "test_resume",
            r"the optimizer's state was not restored\. AdamW keeps"),
    Mistake("shuffled_x", "memorize", "amp_step(model, optimizer, scaler, x, y, recipe)",
            "amp_step(model, optimizer, scaler, x[torch.randperm(len(x))], y, recipe)",
            "test_memorize", r"The memorization test fails.*x and y no longer paired"),
)


LAB2 = Lab(LAB)
solution, released, with_mistake = LAB2.solution, LAB2.released, LAB2.with_mistake
hand_in, hidden_test_lines = LAB2.hand_in, LAB2.hidden_test_lines


# ----------------------------------------------------------------------------- one batch


@dataclass(frozen=True)
class Graded:
    scores: dict  # student -> {test grade_id: points}
    tests: dict  # student -> {test grade_id: the autograded test cell}
    feedback: dict  # student -> (the HTML page, its text)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    tmp = tmp_path_factory.mktemp("lab2")
    subs = tmp / "submissions"
    hand_in(subs, "solution", solution())
    hand_in(subs, "untouched", released())
    for mistake in MISTAKES:
        hand_in(subs, mistake.student_id, with_mistake(mistake))

    course = Course.at(ROOT, tmp / "grading")
    results = grade(course, LAB, subs, get_profile("cpu"), progress=False, jobs=2)
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
    return Graded(scores, tests, feedback)


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB2.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB2.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    assert graded.scores["solution"] == POINTS


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


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    _, text = graded.feedback[mistake.student_id]
    assert re.search(mistake.teaching, text, re.S), f"{mistake.student_id}: no teaching"
    _, control = graded.feedback["solution"]  # the message comes from the failed test
    assert not re.search(mistake.teaching, control, re.S)


def test_no_feedback_page_shows_a_hidden_test(graded):
    hidden = hidden_test_lines()
    assert len(hidden) >= 8, "the lab's hidden tests were not found"
    assert set(graded.feedback) == {"solution", "untouched", *(m.student_id for m in MISTAKES)}
    for student, (page, text) in graded.feedback.items():
        assert "HIDDEN TESTS" not in page, student
        for line in hidden:
            assert line not in text, f"{student}'s feedback shows the hidden test {line!r}"
