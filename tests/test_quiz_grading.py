"""The course quiz graded end to end, as an instructor grades it: autograder's grade and
generate_feedback on the cpu runner, in the sandbox, with the repository's own solution and
release (labs/quiz, made by `python -m autograder release quiz`).

What it proves about the buttons: nbgrader runs the saved notebook again in a fresh kernel, so
a learner who picked every answer and wrote the lines the buttons showed into the answer cells
gets full marks, and one who clicked q07 but never wrote its line loses exactly q07's point,
with a message that says so.

Six learners hand in, graded in one batch: the solution, the untouched release, those two, one
who made six common mistakes (each a string replacement in one answer cell; independent, so one
notebook holds them all and each must cost exactly its question's points, with the check's
teaching message in the feedback) and one who patched the grading function. No feedback page
shows a hidden test or an answer the learner did not write.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import nbformat
import pytest
from lab_grading import (
    expect_feedback_teaches,
    expect_full_marks,
    expect_no_hidden_test_in_feedback,
    expect_untouched_scores_zero,
    grade_batch,
)
from lab_submissions import (
    Lab,
    Mistake,
    cell_by_grade_id,
    error_of,
    grade_id,
    points_of,
    read,
)

from gpulab.quiz import Pick, choose

pytestmark = [pytest.mark.quiz, pytest.mark.slow]

QUIZ = Lab("quiz")
CHOICE = ("q01", "q03", "q06", "q07", "q08", "q09", "q10", "q11", "q13", "q14", "q17", "q18",
          "q19", "q21", "q22", "q24", "q25")
POINTS = {f"q{i:02d}": 1 if f"q{i:02d}" in CHOICE else 2 for i in range(1, 26)}
FULL_MARKS = 33
STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
CLICKED_ONLY = "q07"  # the question the "clicked" learner answered with a click alone
MISTAKEN = "six_mistakes"

MISTAKES = (
    Mistake("wrong_pick", "q13_answer", 'q13 = "d"', 'q13 = "b"', "q13",
            r'q13: "b" is not the best choice\. Lesson 04, sections 4 and 5 explains it\.'),
    Mistake("everything_equal", "q03_answer", 'q03 = "c"',
            'class Anything(str):\n    def __eq__(self, other):\n        return True\n\n'
            '    __hash__ = str.__hash__\n\n\nq03 = Anything("a")', "q03",
            r'q03: "a" is not the best choice'),
    Mistake("seconds_not_ms", "q12_answer", ") * 1e3", ")", "q12",
            r"q12 = 0\.01757 milliseconds is not within 1% of the answer\. It is off by a "
            r"factor of 1e3: check that it is in milliseconds"),
    Mistake("bubble_in_percent", "q20_answer", "q20 = schedule", "q20 = 100 * schedule", "q20",
            r"q20 = 22\.58\d* is outside \[0, 1\], the range the question gives"),
    Mistake("zero1_not_zero2", "q16_answer", "zero_stage=2", "zero_stage=1", "q16",
            r"q16 = 61\.75 GB is not within 1% of the answer\."),
    Mistake("number_as_text", "q15_answer",
            'q15 = cost_model.busbw("all_reduce", cost_model.algbw(4e9, 0.050), 8)',
            'q15 = "140 GB/s"', "q15",
            r"q15 must be a number in GB/s \(such as q15 = 12\.5\), not a str"),
)


def _solution_region(cell) -> str:
    return cell.source.split("### BEGIN SOLUTION\n")[1].split("\n### END SOLUTION")[0]


def picked_and_written(clicked_only: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """The release as a learner hands it in after answering every question right: for a choice,
    clicked in the buttons (headless here) and the line they showed written into the answer
    cell; for a number, the solution's code. Questions in `clicked_only` were clicked, and the
    click is recorded in the saved notebook (the buttons' output), but their line never
    written: their answer cells still hold the stub."""
    solution, nb = QUIZ.solution(), QUIZ.released()
    for qid in POINTS:
        cell = cell_by_grade_id(nb, f"{qid}_answer")
        right = _solution_region(cell_by_grade_id(solution, f"{qid}_answer"))
        assert STUB in cell.source, f"{qid}: the release's answer cell changed"
        if qid not in CHOICE:
            cell.source = cell.source.replace(STUB, right)
            continue
        letter = re.fullmatch(rf'{qid} = "([a-d])"', right).group(1)
        choices = cell_by_grade_id(solution, f"{qid}_choices")
        call = ast.parse(choices.source).body[0].value  # choose("q07", {...})
        options = ast.literal_eval(call.args[1])
        namespace = {}
        picker = choose(qid, options, namespace, interactive=False)
        line = picker.pick(letter)  # what the click shows
        assert isinstance(namespace[qid], Pick)
        shown = cell_by_grade_id(nb, f"{qid}_choices")
        shown.outputs = [nbformat.v4.new_output(
            "execute_result", data={"text/plain": picker.text()}, execution_count=1)]
        if qid not in clicked_only:
            cell.source = cell.source.replace(STUB, line)
    return nb


def hand_in_learners(folder):
    QUIZ.hand_in(folder, "picked_and_written", picked_and_written())
    QUIZ.hand_in(folder, "clicked_only", picked_and_written(clicked_only=(CLICKED_ONLY,)))
    mistaken = QUIZ.solution()
    for mistake in MISTAKES:
        QUIZ.with_mistake(mistake, mistaken)
    QUIZ.hand_in(folder, MISTAKEN, mistaken)
    tampered = QUIZ.solution()
    answer = cell_by_grade_id(tampered, "q03_answer")
    answer.source = answer.source.replace(
        'q03 = "c"', 'q03 = "a"\nimport gpulab.quiz\n\ngpulab.quiz.grade_pick = lambda *args, '
                     '**kwargs: None  # every pick is right')
    QUIZ.hand_in(folder, "tampered", tampered)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # The mistakes go in one notebook (see hand_in_learners): a kernel per learner is the cost.
    return grade_batch(QUIZ, (), tmp_path_factory.mktemp("quiz"), POINTS,
                       extra=hand_in_learners)


def as_own_submission(mistake: Mistake) -> Mistake:
    """`mistake` as the lab_grading expectations read it: handed in by MISTAKEN."""
    return dataclasses.replace(mistake, student_id=MISTAKEN)


# ----------------------------------------------------------------------------- the quiz itself


def test_the_quiz_states_its_points_in_its_test_cells_and_its_table():
    assert points_of(QUIZ.solution()) == {q: float(p) for q, p in POINTS.items()}
    stale = "labs/quiz is out of step: run `python -m autograder release quiz`"
    assert points_of(QUIZ.released()) == {q: float(p) for q, p in POINTS.items()}, stale
    assert sum(POINTS.values()) == FULL_MARKS
    table = re.findall(r"^\| (q\d\d) \| \d\d \| .* \| (choice|number) \| (\d) \|$",
                       QUIZ.solution().cells[0].source, re.M)
    assert [(q, int(p)) for q, _, p in table] == list(POINTS.items())
    assert [q for q, kind, _ in table if kind == "choice"] == list(CHOICE)
    assert f"{FULL_MARKS} points in all" in QUIZ.solution().cells[0].source


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution():
    for mistake in MISTAKES:
        assert len(QUIZ.cells_changed_by(mistake)) == 1, mistake.student_id


def test_the_learner_submission_differs_from_the_release_only_in_answer_cells():
    release, learner = QUIZ.released(), picked_and_written()
    changed = [grade_id(a) for a, b in zip(release.cells, learner.cells, strict=True)
               if a.source != b.source]
    assert changed == [f"{q}_answer" for q in POINTS]


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    expect_full_marks(graded, POINTS)


def test_answers_picked_with_the_buttons_and_written_down_get_full_marks(graded):
    assert graded.scores["picked_and_written"] == {q: float(p) for q, p in POINTS.items()}
    assert not graded.results["picked_and_written"].flags


def test_a_click_alone_does_not_survive_grading_and_costs_that_question_only(graded):
    want = {q: 0.0 if q == CLICKED_ONLY else float(p) for q, p in POINTS.items()}
    assert graded.scores["clicked_only"] == want
    error = error_of(graded.tests["clicked_only"][CLICKED_ONLY])
    assert error.ename == "AssertionError"
    assert f"{CLICKED_ONLY} is still None" in error.evalue
    assert "Replace `raise NotImplementedError()` with your code." in error.evalue


def test_the_untouched_release_gets_zero_and_says_what_to_replace(graded):
    expect_untouched_scores_zero(graded, POINTS)


def test_each_mistake_costs_exactly_the_points_of_its_question(graded):
    wrong = {m.test for m in MISTAKES}
    assert len(wrong) == len(MISTAKES)
    want = {q: 0.0 if q in wrong else float(p) for q, p in POINTS.items()}
    assert graded.scores[MISTAKEN] == want


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_fails_its_test_with_the_teaching_message(graded, mistake):
    error = error_of(graded.tests[MISTAKEN][mistake.test])
    assert error.ename == "AssertionError"
    assert re.search(mistake.teaching, error.evalue, re.S), error.evalue


def test_patching_the_grader_earns_nothing_and_is_flagged(graded):
    result = graded.results["tampered"]
    assert graded.scores["tampered"]["q03"] == 0.0
    assert any("gpulab.quiz.grade_pick" in flag for flag in result.flags), result.flags
    assert all(graded.scores["tampered"][q] == float(POINTS[q]) for q in ("q01", "q02"))


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    expect_feedback_teaches(graded, as_own_submission(mistake))


def test_no_feedback_page_shows_a_hidden_test(graded):
    expect_no_hidden_test_in_feedback(graded, QUIZ, at_least=2 * len(POINTS))


def test_feedback_gives_no_answer_away(graded):
    """A learner's page shows the answers they wrote, never one they did not: the untouched
    release's page has none of the solution's answer lines, and a wrong pick's message names
    the pick, not the answer."""
    solution = QUIZ.solution()
    answers = [_solution_region(cell_by_grade_id(solution, f"{q}_answer")) for q in POINTS]
    _, untouched = graded.feedback["untouched"]
    shown = [line for line in answers if line in untouched]
    assert not shown, shown
    wrong = error_of(graded.tests[MISTAKEN]["q13"]).evalue
    assert '"d"' not in wrong
    _, page = graded.feedback[MISTAKEN]
    assert "grade_pick" not in page and "grade_number" not in page


def test_the_grader_saw_the_buttons_run_headless(graded):
    """The buttons' cells ran in the grading kernel (widgets with no frontend) and stored nothing:
    the test after each reads the answer cell's plain letter."""
    nb = read(Path(graded.results["picked_and_written"].autograded) / QUIZ.notebook)
    for qid in CHOICE:
        cell = cell_by_grade_id(nb, f"{qid}_choices")
        (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert "Click a choice" in out.data["text/plain"], qid
