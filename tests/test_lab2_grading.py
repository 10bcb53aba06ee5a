"""Lab 2 graded end to end, as an instructor grades it: autograder's grade and generate_feedback on
the cpu runner, with the repository's own solution and release (labs/lab2_amp_training, made by
`python -m autograder release lab2_amp_training`).

Eight learners hand in, graded in one batch: the full solution, the untouched release, and the
solution with one part broken the way learners break it (MISTAKES: a string replacement in one
answer cell, which must be found there exactly once). Each mistake must cost exactly its part's
points, and its feedback must show the checker's teaching message and no hidden test.
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

pytestmark = [pytest.mark.lab2, pytest.mark.slow]

LAB = "lab2_amp_training"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_to_device": 2,
    "test_amp_step": 4,
    "test_accumulate_gradients": 3,
    "test_resume": 4,
    "test_memorize": 2,
}
FULL_MARKS = 15


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


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return grade_batch(LAB2, MISTAKES, tmp_path_factory.mktemp("lab2"), POINTS)


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB2.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB2.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    expect_full_marks(graded, POINTS)


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    expect_untouched_scores_zero(graded, POINTS)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    expect_mistake_costs_its_part(graded, POINTS, mistake)


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    expect_feedback_teaches(graded, mistake)


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, LAB2, at_least=8)
