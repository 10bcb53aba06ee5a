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

import psutil
import pytest
from hostile import check_outcome, hand_in_all
from hostile.cases import LAB3, LAB3_ORPHAN_MARKER
from lab_grading import (
    expect_feedback_teaches,
    expect_full_marks,
    expect_mistake_costs_its_part,
    expect_no_hidden_test_in_feedback,
    expect_untouched_scores_zero,
    grade_batch,
)
from lab_submissions import Lab, Mistake, error_of

pytestmark = [pytest.mark.lab3, pytest.mark.slow]

LAB = "lab3_ddp_from_scratch"
# The lab's parts as its introduction states them: test cell grade_id -> points.
POINTS = {
    "test_ring_all_reduce": 6,
    "test_simple_ddp": 3,
    "test_fast_ddp": 7,
    "test_train_ddp": 4,
}
FULL_MARKS = 20

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


def orphans() -> list[str]:
    """Command lines of live processes carrying the orphans case's marker."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if LAB3_ORPHAN_MARKER in line:
            found.append(line)
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    assert not orphans(), "processes of an earlier run are still alive"
    return grade_batch(LAB3_SUB, MISTAKES, tmp_path_factory.mktemp("lab3"), POINTS,
                       extra=lambda folder: hand_in_all(folder, LAB3))


@pytest.fixture(scope="module")
def left_behind(graded) -> list[str]:
    """What the hostile rings left running once grading was over."""
    return orphans()


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB3_SUB.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(LAB3_SUB.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    expect_full_marks(graded, POINTS)


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    expect_untouched_scores_zero(graded, POINTS)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    expect_mistake_costs_its_part(graded, POINTS, mistake)


# ----------------------------------------------------------------------------- hostile rings


@pytest.mark.parametrize("case", LAB3, ids=lambda case: case.student_id)
def test_a_hostile_ring_costs_its_part_and_nothing_else(graded, case):
    check_outcome(case, graded.results[case.student_id])


def test_no_process_a_ring_started_outlives_grading(graded, left_behind):
    error = error_of(graded.tests["lab3_orphans"]["test_ring_all_reduce"])
    assert "the tensor passed in is unchanged" in error.evalue, "the ring did not get to return"
    assert not left_behind, f"left behind: {left_behind[:3]}"


def test_a_ring_that_never_returns_is_stopped_and_explained(graded):
    error = error_of(graded.tests["lab3_stubborn"]["test_ring_all_reduce"])
    assert re.search(r"did not finish within 20 s, and every rank was stopped", error.evalue)


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    expect_feedback_teaches(graded, mistake)


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, LAB3_SUB, at_least=5)
