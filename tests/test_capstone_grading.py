"""The capstone graded end to end, as an instructor grades it: autograder's grade and
generate_feedback on the cpu runner, in the sandbox, with the repository's own solution and
release (labs/capstone_distributed_gpt, made by `python -m autograder release
capstone_distributed_gpt`). Every graded part starts a real 2-node x 2-process cluster from
inside the grading kernel.

Four learners hand in, graded in one batch: the full solution, the untouched release, a learner
who loosens the checker (tests/hostile/cases.py: CAPSTONE), and one submission with two
independent mistakes (a memory prediction that forgets FSDP2's sharding, a
resume that leaves the optimizer's state behind), each costing exactly its part with the
checker's teaching message. The written answer (Part 4) is left for a person: autograding gives
it no score (the release's untouched answer gets nbgrader's 0), and the release does not contain
its rubric.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from hostile import CAPSTONE as HOSTILE
from hostile import check_outcome, hand_in_all
from lab_grading import (
    expect_no_hidden_test_in_feedback,
    expect_untouched_scores_zero,
    grade_batch,
)
from lab_submissions import Lab, Mistake, cell_by_grade_id, error_of, points_of

pytestmark = [pytest.mark.capstone, pytest.mark.slow, pytest.mark.dist]

CAPSTONE = Lab("capstone_distributed_gpt")
POINTS = {"test_sharded_training": 4, "test_memory_plan": 3, "test_elastic_resume": 4}
WRITTEN = ("written_answer", 3)  # graded by hand
MISTAKES = (
    Mistake("unsharded_prediction", "predict_memory", "world_size=plan.dp_size)",
            "world_size=1)", "test_memory_plan",
            r"predict_memory says .*the measured peak is .*more than was there"),
    Mistake("optimizer_left_behind", "load_checkpoint",
            '    state = {"model": model_state, "optim": optim_state}\n'
            '    dcp.load(state, checkpoint_id=done[-1])\n'
            '    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
            '                   optim_state_dict=state["optim"])',
            '    state = {"model": model_state}\n'
            '    dcp.load(state, checkpoint_id=done[-1])\n'
            '    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
            '                   optim_state_dict=optim_state)',
            "test_elastic_resume",
            r"replayed after the resume, gave loss .*save and load the optimizer's state"),
)


class BothMistakes(Lab):
    """The solution with every mistake of MISTAKES made at once, handed in as one learner."""

    def with_both(self):
        nb = self.solution()
        for mistake in MISTAKES:
            nb = self.with_mistake(mistake, nb)
        return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    lab = BothMistakes(CAPSTONE.name)

    def extra(folder):
        lab.hand_in(folder, "two_mistakes", lab.with_both())
        hand_in_all(folder, HOSTILE)

    return grade_batch(lab, (), tmp_path_factory.mktemp("capstone"), POINTS, extra=extra)


def test_the_capstone_states_its_points():
    assert points_of(CAPSTONE.solution()) == POINTS == points_of(CAPSTONE.released())
    cell = cell_by_grade_id(CAPSTONE.solution(), WRITTEN[0])
    meta = cell.metadata["nbgrader"]
    assert cell.cell_type == "markdown" and meta["solution"] and meta["grade"]
    assert meta["points"] == WRITTEN[1]
    table = re.findall(r"^\| \d \| .* \| (\d+) \|$", CAPSTONE.solution().cells[0].source, re.M)
    assert [int(p) for p in table] == [*POINTS.values(), WRITTEN[1]]


def test_the_release_holds_no_rubric_and_asks_for_an_answer():
    released = cell_by_grade_id(CAPSTONE.released(), WRITTEN[0])
    solution = cell_by_grade_id(CAPSTONE.solution(), WRITTEN[0])
    assert "Rubric" in solution.source and "Rubric" not in released.source
    assert "YOUR ANSWER HERE" in released.source


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(CAPSTONE.cells_changed_by(mistake)) == 1, mistake.student_id


def test_the_solution_gets_full_marks_and_leaves_the_written_answer_to_a_person(graded):
    assert graded.scores["solution"] == {**{t: float(p) for t, p in POINTS.items()},
                                         WRITTEN[0]: None}
    assert not graded.results["solution"].flags, graded.results["solution"].flags
    assert graded.results["solution"].needs_manual_grade


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    scores = dict(graded.scores["untouched"])
    assert scores.pop(WRITTEN[0]) == 0.0  # nbgrader's rule: an answer left as released
    expect_untouched_scores_zero(dataclasses.replace(
        graded, scores={**graded.scores, "untouched": scores}), POINTS)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_each_mistake_costs_exactly_its_part_and_teaches(graded, mistake):
    scores = graded.scores["two_mistakes"]
    failing = {m.test for m in MISTAKES}
    assert scores == {**{t: 0.0 if t in failing else float(p) for t, p in POINTS.items()},
                      WRITTEN[0]: None}
    error = error_of(graded.tests["two_mistakes"][mistake.test])
    assert error.ename == "AssertionError"
    assert re.search(mistake.teaching, error.evalue, re.S), error.evalue
    _, text = graded.feedback["two_mistakes"]
    assert re.search(mistake.teaching, text, re.S)


@pytest.mark.parametrize("case", HOSTILE, ids=lambda case: case.student_id)
def test_tampering_with_the_checker_earns_nothing(graded, case):
    check_outcome(case, graded.results[case.student_id])


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, CAPSTONE, at_least=2)
