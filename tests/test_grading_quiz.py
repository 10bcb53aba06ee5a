"""The quiz graded end to end: the checks of tests/grading_checks.py on its batch, and what is
particular to it: answers picked with buttons and written down, a click alone, a patched
grader, feedback that gives no answer away, and each learner graded on their own numbers (two
learners who swap their answers lose the numeric points, a classmate's notebook scores zero)."""

import math
import re
from pathlib import Path

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_checks import GRADES, full_scores
from grading_specs import (
    CLICKED_ONLY,
    QUIZ,
    QUIZ_CHOICE,
    QUIZ_NUMERIC,
    SWAPPED,
    picked_and_written,
    solution_region,
)
from lab_submissions import cell_by_grade_id, error_of, grade_id, read

from gpulab.checks.keys import all_answers

SPEC = QUIZ
pytestmark = list(SPEC.marks)


def test_the_quiz_table_names_its_choice_questions_and_its_total():
    intro = QUIZ.lab.solution().cells[0].source
    table = re.findall(r"^\| (q\d\d) \| \d\d \| .* \| (choice|number) \| \d \|$", intro, re.M)
    assert [q for q, _ in table] == list(QUIZ.assignment.points)
    assert [q for q, kind in table if kind == "choice"] == list(QUIZ_CHOICE)
    assert f"{QUIZ.assignment.total:g} points in all" in intro


def test_the_quiz_table_says_what_each_question_heading_says():
    """Each row's lesson, topic and points are its question's heading: `### q02 · Lesson 01:
    <topic> (2 points)`."""
    solution = QUIZ.lab.solution()
    rows = re.findall(r"^\| (q\d\d) \| (\d\d) \| (.*) \| (?:choice|number) \| (\d) \|$",
                      solution.cells[0].source, re.M)
    for question, lesson, topic, points in rows:
        heading = cell_by_grade_id(solution, f"{question}_question").source.splitlines()[0]
        plural = "" if points == "1" else "s"
        assert heading == f"### {question} · Lesson {lesson}: {topic} ({points} point{plural})"


def test_the_quiz_learner_differs_from_the_release_only_in_answer_cells():
    release, learner = QUIZ.lab.released(), picked_and_written()
    changed = [grade_id(a) for a, b in zip(release.cells, learner.cells, strict=True)
               if a.source != b.source]
    assert changed == [f"{q}_answer" for q in QUIZ.assignment.points]


@GRADES
def test_answers_picked_with_the_buttons_and_written_down_get_full_marks(spec, graded):
    """nbgrader runs the saved notebook again in a fresh kernel: what counts is the line the
    buttons showed, written into the answer cell."""
    batch = graded(spec)
    assert batch.scores["picked_and_written"] == full_scores(spec)
    assert not batch.results["picked_and_written"].flags


@GRADES
def test_a_click_alone_does_not_survive_grading_and_costs_that_question_only(spec, graded):
    batch = graded(spec)
    assert batch.scores["clicked_only"] == full_scores(spec, {CLICKED_ONLY})
    error = error_of(batch.tests["clicked_only"][CLICKED_ONLY])
    assert error.ename == "AssertionError"
    assert f"{CLICKED_ONLY} is still None" in error.evalue and spec.stub_hint in error.evalue


@GRADES
def test_patching_the_grader_earns_nothing_and_is_flagged(spec, graded):
    batch = graded(spec)
    result = batch.results["tampered"]
    assert batch.scores["tampered"]["q05"] == 0.0
    assert any("gpulab.checks.quiz.grade_pick" in flag for flag in result.flags), result.flags
    assert all(batch.scores["tampered"][q] == spec.assignment.points[q]
               for q in ("q01", "q02", "q03", "q04"))


@GRADES
def test_the_quiz_feedback_gives_no_answer_away(spec, graded):
    """A learner's page shows the answers they wrote, never one they did not: the untouched
    release's page has none of the solution's answer lines, and a wrong pick's message names
    the pick, not the answer."""
    batch = graded(spec)
    solution = spec.lab.solution()
    answers = [solution_region(cell_by_grade_id(solution, f"{q}_answer"))
               for q in spec.assignment.points]
    _, untouched = batch.feedback["untouched"]
    shown = [line for line in answers if line in untouched]
    assert not shown, shown
    wrong = error_of(batch.tests[spec.together]["q12"]).evalue
    assert '"a"' not in wrong
    _, page = batch.feedback[spec.together]
    assert "grade_pick" not in page and "grade_number" not in page


@GRADES
def test_the_grader_saw_the_buttons_run_headless(spec, graded):
    """The buttons' cells ran in the grading kernel (widgets with no frontend) and stored
    nothing: the test after each reads the answer cell's plain letter."""
    batch = graded(spec)
    nb = read(Path(batch.results["picked_and_written"].autograded) / spec.lab.notebook)
    for qid in QUIZ_CHOICE:
        cell = cell_by_grade_id(nb, f"{qid}_choices")
        (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert "Click a choice" in out.data["text/plain"], qid


@GRADES
def test_each_learner_is_graded_on_their_own_numbers(spec, graded):
    """Two learners hand in the solution, which computes from their own numbers: full marks for
    both. Two others hand in each other's answers written down as numbers (their numbers differ
    in every numeric question): each loses exactly the numeric questions, as wrong numbers."""
    batch = graded(spec)
    assert batch.scores["solution"] == batch.scores["picked_and_written"] == full_scores(spec)
    for student, whose in SWAPPED.items():
        mine, theirs = all_answers("quiz", student), all_answers("quiz", whose)
        assert not [n for n in mine if math.isclose(mine[n], theirs[n], rel_tol=0.01)], student
        assert batch.scores[student] == full_scores(spec, QUIZ_NUMERIC), student
        for qid in QUIZ_NUMERIC:
            wrong = error_of(batch.tests[student][qid]).evalue
            assert re.search(r"is not (within 1% of|exactly) the answer", wrong), (qid, wrong)
        assert not batch.results[student].flags, student


@GRADES
def test_a_classmates_notebook_scores_zero_and_says_why(spec, graded):
    """Its LEARNER names ada (the hostile bank's case checks its scores and flag): the learner's
    page and the instructor's line say so."""
    batch = graded(spec)
    _, page = batch.feedback["quiz_other_learner"]
    assert ('written for another learner (LEARNER = "ada"), but quiz_other_learner handed it in'
            in page)
    total = f"{spec.assignment.total:g}"
    assert re.search(rf"(?m)^quiz_other_learner\s+0 / {total}\s+flagged: learner mismatch: ada",
                     batch.run.out), batch.run.out
