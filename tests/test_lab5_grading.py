"""Lab 5 graded end to end, as an instructor grades it: autograder's grade and generate_feedback
on the cpu runner, in the sandbox, with the repository's own solution and release
(labs/lab5_parallelism_across_nodes, made by `python -m autograder release
lab5_parallelism_across_nodes`). The checkers start real gloo ranks from inside the grading
kernel, and Part 4 a two-node cluster (on loopback: the sandbox has no other interface).

Four learners hand in, graded in one batch: the full solution, the untouched release, and two
mistakes (a string replacement in one answer cell, found there exactly once). A mistake costs the
points of the tests that use the broken code (Part 4 uses every earlier part), with the
checker's teaching message in the feedback and no hidden test.
"""

from __future__ import annotations

import pytest
from lab_grading import (
    expect_feedback_teaches,
    expect_full_marks,
    expect_mistake_costs_its_part,
    expect_no_hidden_test_in_feedback,
    expect_untouched_scores_zero,
    grade_batch,
)
from lab_submissions import Lab, Mistake

pytestmark = [pytest.mark.lab5, pytest.mark.slow, pytest.mark.dist]

LAB = "lab5_parallelism_across_nodes"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_tp_linear": 4,
    "test_tp_mlp": 3,
    "test_one_f_one_b": 4,
    "test_pp_tp_cluster": 5,
}
FULL_MARKS = 16

MISTAKES = (
    Mistake("warmup_one_too_many", "one_f_one_b", "warmup = min(p - stage - 1, m)",
            "warmup = min(p - stage, m)", "test_one_f_one_b",
            r"Its warm-up is 4 forwards, too many: then stage 0 holds 5 microbatches at once"),
    Mistake("mlp_left_whole", "pp_tp_step",
            "        block.ff = TPMLP(block.ff, groups.tp)  # this rank's half of each MLP\n",
            "        pass\n", "test_pp_tp_cluster",
            r"blocks\.0\.ff is a FeedForward, not your TPMLP: replace each Block's MLP"),
)
# Part 4 runs the learner's 1F1B order: a wrong order costs it too.
ALSO_FAILS = {"warmup_one_too_many": ("test_pp_tp_cluster",)}

LAB5_SUB = Lab(LAB)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_batch(LAB5_SUB, MISTAKES, tmp_path_factory.mktemp("lab5"), POINTS)


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB5_SUB.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB5_SUB.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    expect_full_marks(graded, POINTS)


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    expect_untouched_scores_zero(graded, POINTS)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    expect_mistake_costs_its_part(graded, POINTS, mistake,
                                  also_fails=ALSO_FAILS.get(mistake.student_id, ()))


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    expect_feedback_teaches(graded, mistake)


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, LAB5_SUB, at_least=4)
