"""Lab 4 graded end to end, as an instructor grades it: autograder's grade and generate_feedback
on the cpu runner, in the sandbox, with the repository's own solution and release
(labs/lab4_memory_and_profiling, made by `python -m autograder release
lab4_memory_and_profiling`). Part A grades numbers and a step under a memory budget, Part B a
speed-up measured as a ratio inside the grading kernel.

Seven learners hand in, graded in one batch: the full solution, the untouched release, four
mistakes (a string replacement in one answer cell, found there exactly once), and Lab 4's case
of the hostile bank: a clock that stops while fast_train runs. A mistake costs exactly the points
of the tests that grade its function, with the checker's teaching message in the feedback and no
hidden test; a pipeline that is right but no faster keeps its results' points and loses the
speed-up's.
"""

from __future__ import annotations

import pytest
from hostile import check_outcome, hand_in_all
from hostile.cases import LAB4
from lab_grading import (
    expect_feedback_teaches,
    expect_full_marks,
    expect_mistake_costs_its_part,
    expect_no_hidden_test_in_feedback,
    expect_untouched_scores_zero,
    grade_batch,
)
from lab_submissions import Lab, Mistake

pytestmark = [pytest.mark.lab4, pytest.mark.slow]

LAB = "lab4_memory_and_profiling"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_diagnosis": 3,
    "test_fit_step": 5,
    "test_fast_results": 2,
    "test_speedup": 4,
}
FULL_MARKS = 14

MISTAKES = (
    Mistake("share_in_percent", "diagnosis",
            "DOMINANT_SHARE = sizes[DOMINANT_CATEGORY] / peak.total",
            "DOMINANT_SHARE = 100 * sizes[DOMINANT_CATEGORY] / peak.total",
            "test_diagnosis", r"not a percentage"),
    Mistake("undivided_loss", "fit_step", " * (len(x_micro) / n_total)", "", "test_fit_step",
            r"4 times the batch's gradient"),
    Mistake("scaled_not_standardized", "fast_train",
            "x_all = (v - v.mean(1, keepdim=True)) / v.std(1, correction=0, keepdim=True)",
            "x_all = v", "test_fast_results",
            r"The transform differs: the images were scaled to \[0, 1\] \(pixel / 16\) but not "
            r"standardized"),
    Mistake("slow_train_renamed", "fast_train", "    model.train()\n",
            "    return slow_train(model, optimizer, images, labels, steps=steps,\n"
            "                      batch_size=batch_size, seed=seed)\n", "test_speedup",
            r"fast_train is [\d.]+x as fast as slow_train; it must be at least 3x"),
)
# A wrong fast_train fails both of its tests: the speed-up counts only for the same results.
ALSO_FAILS = {"scaled_not_standardized": ("test_speedup",)}

LAB4_SUB = Lab(LAB)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_batch(LAB4_SUB, MISTAKES, tmp_path_factory.mktemp("lab4"), POINTS,
                       extra=lambda folder: hand_in_all(folder, LAB4))


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB4_SUB.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB4_SUB.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    expect_full_marks(graded, POINTS)


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    expect_untouched_scores_zero(graded, POINTS)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    expect_mistake_costs_its_part(graded, POINTS, mistake,
                                  also_fails=ALSO_FAILS.get(mistake.student_id, ()))


@pytest.mark.parametrize("case", LAB4, ids=lambda c: c.student_id)
def test_a_tampered_clock_costs_the_speed_up_and_nothing_else(graded, case):
    check_outcome(case, graded.results[case.student_id])


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    expect_feedback_teaches(graded, mistake)


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, LAB4_SUB, at_least=6)
