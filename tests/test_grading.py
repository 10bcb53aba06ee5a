"""Every graded notebook graded end to end, as an instructor grades it: autograder's grade (cpu
profile, sandboxed kernels, two at a time) and feedback, with the repository's own solution and
release, for the five labs, the quiz and the capstone (tests/grading_specs.py: one spec each).

One batch per notebook, graded once and shared by its tests: the solution, the untouched
release, the spec's end-to-end mistakes (one notebook holding those in distinct parts), the
hostile bank's cases for that notebook (tests/hostile, selected by their `lab` field, so a case
added to the bank is graded here without more code), and the notebook's own learners (the
quiz's). Each check is written once, for every notebook: the points of its ASSIGNMENT table,
full marks for the solution, zero with the stub hint for the release, a mistake costs exactly
its part and its feedback teaches it, no hidden test reaches a feedback page, grading writes
nothing into the repository, each hostile case ends as the bank says. What is particular to a
notebook follows at the end: Lab 1 through the CLI (grade, feedback, export), Lab 3's rings
that leave processes behind or never return, the quiz's buttons and answers, the capstone's
written answer. Every known mistake of the labs and the quiz also fails its checker in the
checkers' own tests (tests/grading_specs.py says which).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from grading_specs import (
    CAPSTONE,
    CLICKED_ONLY,
    LAB1,
    LAB3,
    QUIZ,
    QUIZ_CHOICE,
    SPECS,
    Spec,
    params,
    picked_and_written,
    solution_region,
)
from hostile import cases_for, check_outcome, hand_in_all
from lab_submissions import ROOT, cell_by_grade_id, error_of, grade_id, page_text, points_of, read

from autograder import gradebook
from autograder.cli import main as autograder_cli
from autograder.course import Course
from autograder.feedback import generate_feedback
from autograder.grade import grade
from autograder.profiles import get_profile

JOBS = 2  # kernels at once: the grading kernels wait on processes, files and ranks
GRADES = pytest.mark.slow  # each notebook's batch is minutes on a 2-core machine


@dataclass(frozen=True)
class Graded:
    """One notebook's batch, graded."""

    results: dict  # student -> the grader's GradeResult
    scores: dict  # student -> {grade_id: points, None for a cell a person grades}
    tests: dict  # student -> {grade_id: the autograded test cell}
    feedback: dict  # student -> (the HTML page, its text as a reader sees it)
    changed: list  # files of the repository's solutions/<lab> and labs/<lab> grading changed
    left_behind: list  # command lines of processes of the batch still alive after grading
    out: str = ""  # what the CLI printed (Lab 1)
    grades_csv: tuple = ()  # the CLI's export (Lab 1)


def digest(*folders: Path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def alive_with(marker: str) -> list[str]:
    """Command lines of live processes that carry `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if marker in line:
            found.append(line)
    return found


def cli(argv) -> tuple[int, str]:
    """Run `python -m autograder ARGV` in this process: (exit status, stdout then stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = autograder_cli([str(a) for a in argv])
    return code, out.getvalue() + err.getvalue()


def is_the_solution(case) -> bool:
    """A case that hands in the lab's own solution unchanged ("nothing: the lab's own
    solution"): the batch's "solution" is that notebook, graded once for both."""
    return case.base == "solution" and not (case.code or case.answers or case.edit or case.raw)


def hand_in(spec: Spec, folder: Path) -> None:
    lab = spec.lab
    lab.hand_in(folder, "solution", lab.solution())
    lab.hand_in(folder, "untouched", lab.released())
    for student, mistakes in spec.graded_mistakes().items():
        lab.hand_in(folder, student, spec.with_mistakes(mistakes))
    hand_in_all(folder, [case for case in cases_for(spec.name) if not is_the_solution(case)])
    if spec.extra is not None:
        spec.extra(folder)


def grade_batch(spec: Spec, tmp: Path) -> Graded:
    subs, grading = tmp / "submissions", tmp / "grading"
    hand_in(spec, subs)
    marker = spec.leftover_marker
    assert marker is None or not alive_with(marker), "processes of an earlier run are alive"
    repo = ROOT / "solutions" / spec.name, ROOT / "labs" / spec.name
    before = digest(*repo)

    out, grades_csv = "", ()
    if spec.cli:  # as the README tells instructors
        where = ["--root", ROOT, "--course-dir", grading]
        code, out = cli(["grade", spec.name, subs, *where, "--jobs", JOBS])
        feedback_code, feedback_out = cli(["feedback", spec.name, *where])
        export_code, export_out = cli(["export", *where, "--output", tmp / "grades.csv"])
        assert (code, feedback_code, export_code) == (0, 0, 0), out + feedback_out + export_out
        records = [gradebook.recorded(grading, spec.name, f.name) for f in sorted(subs.iterdir())]
        results = [record.grade_result(grading) for record in records if record is not None]
        grades_csv = tuple(csv.DictReader((tmp / "grades.csv").open()))
    else:
        course = Course.at(ROOT, grading)
        results = grade(course, spec.name, subs, get_profile("cpu"), progress=False, jobs=JOBS)
        generate_feedback(course, spec.name)
    left_behind = alive_with(marker) if marker else []
    after = digest(*repo)
    print(f"{spec.short}: seconds per submission:",
          {r.student_id: round(r.seconds) for r in results})
    expected_errors = {case.student_id for case in cases_for(spec.name) if case.error}
    errors = {r.student_id: r.error for r in results
              if not r.ok and r.student_id not in expected_errors}
    assert not errors, f"the grader failed on: {errors}"

    graded_cells = {**spec.assignment.points, **spec.manual}
    scores, tests, feedback = {}, {}, {}
    for result in results:
        if not result.ok:
            continue
        scores[result.student_id] = {c.grade_id: c.auto_score for c in result.scores}
        nb = read(Path(result.autograded) / spec.lab.notebook)
        tests[result.student_id] = {grade_id(c): c for c in nb.cells
                                    if grade_id(c) in graded_cells}
        page = (grading / "feedback" / result.student_id / spec.name
                / f"{spec.name}.html").read_text()
        feedback[result.student_id] = (page, page_text(page))
    changed = sorted(set(before.items()) ^ set(after.items()))
    by_student = {r.student_id: r for r in results}
    by_student.update({case.student_id: by_student["solution"]
                       for case in cases_for(spec.name) if is_the_solution(case)})
    return Graded(by_student, scores, tests, feedback,
                  [path for path, _ in changed], left_behind, out, grades_csv)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """graded(spec): that notebook's batch, graded the first time a test asks for it."""
    done: dict[str, Graded | BaseException] = {}

    def batch(spec: Spec) -> Graded:
        if spec.name not in done:
            try:
                done[spec.name] = grade_batch(spec, tmp_path_factory.mktemp(spec.short))
            except Exception as error:  # each test of this notebook fails with it, not again
                done[spec.name] = error
        if isinstance(done[spec.name], BaseException):
            raise done[spec.name]
        return done[spec.name]

    return batch


def full_scores(spec: Spec, failing=()) -> dict:
    """What a submission scores when exactly the tests in `failing` fail."""
    return {**{t: 0.0 if t in failing else float(p) for t, p in spec.assignment.points.items()},
            **spec.manual}


def mistaken(specs=SPECS) -> list:
    """(spec, learner, the mistakes in their notebook) for every end-to-end mistake."""
    return [pytest.param(spec, student, mistakes, marks=spec.marks, id=f"{spec.short}-{student}")
            for spec in specs for student, mistakes in spec.graded_mistakes().items()]


def each_mistake(specs=SPECS, graded_only=False) -> list:
    return [pytest.param(spec, student, mistake, marks=spec.marks,
                         id=f"{spec.short}-{mistake.student_id}")
            for spec in specs
            for student, mistakes in (spec.graded_mistakes().items() if graded_only
                                      else ((m.student_id, (m,)) for m in spec.mistakes))
            for mistake in mistakes]


# ----------------------------------------------------------------------------- the notebooks


@pytest.mark.parametrize("spec", params(SPECS))
def test_the_notebook_states_its_points_in_its_test_cells_and_its_table(spec):
    """The solution's and the release's test cells carry the ASSIGNMENT table's points, the cells
    a person grades carry theirs, and the introduction's table of parts lists them in order."""
    assignment, lab = spec.assignment, spec.lab
    points = {t: float(p) for t, p in assignment.points.items()}
    assert points_of(lab.solution()) == points
    stale = f"labs/ is out of step: run `python -m autograder release {spec.name}`"
    assert points_of(lab.released()) == points, stale
    for name, manual_points in assignment.manual:
        meta = cell_by_grade_id(lab.solution(), name).metadata["nbgrader"]
        assert meta["solution"] and meta["grade"] and meta["points"] == manual_points
    table = re.findall(r"^\| (?:\d|q\d\d) \| .* \| (\d+) \|$", lab.solution().cells[0].source,
                       re.M)
    assert [int(p) for p in table] == [*assignment.points.values(),
                                       *(p for _, p in assignment.manual)]


@pytest.mark.parametrize(("spec", "student", "mistake"), each_mistake())
def test_every_mistake_breaks_one_answer_cell_of_the_current_solution(spec, student, mistake):
    """Its text is found in the solution (with_mistake raises when not) and it changes exactly
    one answer cell; the test cells it fails are the notebook's."""
    assert len(spec.lab.cells_changed_by(mistake)) == 1
    assert {mistake.test, *mistake.also_fails} <= set(spec.assignment.points)


@pytest.mark.parametrize("spec", params(SPECS))
def test_every_known_mistake_loses_its_points_in_some_test(spec):
    """Each is run through its checker by the checker tests that the spec names (one test over
    all of SPEC.mistakes there), or, where it names none, graded here end to end."""
    if spec.checker_tests is None:
        assert set(spec.end_to_end) == {m.student_id for m in spec.mistakes}
        return
    source = (ROOT / spec.checker_tests).read_text()
    assert f"from grading_specs import {spec.short.upper()} as SPEC\n" in source
    assert '("mistake", SPEC.mistakes' in source
    assert "SPEC.expect_checker_teaches(mistake)" in source


@pytest.mark.parametrize("spec", params(SPECS))
def test_mistakes_handed_in_together_are_in_distinct_parts(spec):
    """So that each one's score and message are its own, and at least one part is left right
    to show that the others cost nothing more."""
    assert len({m.student_id for m in spec.mistakes}) == len(spec.mistakes)
    for mistakes in spec.graded_mistakes().values():
        failing = [t for m in mistakes for t in (m.test, *m.also_fails)]
        assert len(set(failing)) == len(failing), failing
        assert len({m.cell for m in mistakes}) == len(mistakes)
        assert set(spec.assignment.points) - set(failing), "no part is left right"


# ----------------------------------------------------------------------------- scores


@GRADES
@pytest.mark.parametrize("spec", params(SPECS))
def test_the_solution_gets_full_marks(spec, graded):
    batch = graded(spec)
    assert batch.scores["solution"] == full_scores(spec)
    assert not batch.results["solution"].flags, batch.results["solution"].flags
    assert batch.results["solution"].needs_manual_grade == len(spec.manual)


@GRADES
@pytest.mark.parametrize("spec", params(SPECS))
def test_the_untouched_release_gets_zero_and_says_what_to_replace(spec, graded):
    batch = graded(spec)
    # A cell a person grades gets nbgrader's 0 when its answer is left as released.
    assert batch.scores["untouched"] == {**dict.fromkeys(spec.assignment.points, 0.0),
                                         **dict.fromkeys(spec.manual, 0.0)}
    for test in spec.assignment.points:
        error = error_of(batch.tests["untouched"][test])
        assert error.ename == "AssertionError", (test, error.evalue)
        says = spec.untouched_says.get(test)
        if says is not None:
            assert says in error.evalue, (test, error.evalue)
        else:
            assert "raised NotImplementedError" in error.evalue, (test, error.evalue)
            assert spec.stub_hint in error.evalue, (test, error.evalue)


@GRADES
@pytest.mark.parametrize(("spec", "student", "mistakes"), mistaken())
def test_mistakes_cost_exactly_the_points_of_their_parts(spec, student, mistakes, graded):
    """Each mistake costs its test's points (and those of tests that run the same code) and
    nothing else, failing with the checker's teaching message."""
    batch = graded(spec)
    failing = {t for m in mistakes for t in (m.test, *m.also_fails)}
    assert batch.scores[student] == full_scores(spec, failing)
    for mistake in mistakes:
        error = error_of(batch.tests[student][mistake.test])
        assert error.ename == "AssertionError", mistake.student_id
        assert re.search(mistake.teaching, error.evalue, re.S), error.evalue


# ----------------------------------------------------------------------------- feedback


@GRADES
@pytest.mark.parametrize(("spec", "student", "mistake"), each_mistake(graded_only=True))
def test_feedback_teaches_the_mistake(spec, student, mistake, graded):
    batch = graded(spec)
    _, text = batch.feedback[student]
    assert re.search(mistake.teaching, text, re.S), f"{mistake.student_id}: no teaching"
    # The message comes from the failed test, not from the notebook's own prose or code.
    _, control = batch.feedback["solution"]
    assert not re.search(mistake.teaching, control, re.S)
    failing = {t for m in spec.graded_mistakes()[student] for t in (m.test, *m.also_fails)}
    assert text.count("passed") >= len(spec.assignment.points) - len(failing)


@GRADES
@pytest.mark.parametrize("spec", params(SPECS))
def test_no_feedback_page_shows_a_hidden_test(spec, graded):
    batch = graded(spec)
    hidden = spec.lab.hidden_test_lines()
    assert len(hidden) >= spec.hidden_at_least, "the notebook's hidden tests were not found"
    assert set(batch.feedback) == set(batch.scores)
    for student, (page, text) in batch.feedback.items():
        assert "HIDDEN TESTS" not in page, student
        for line in hidden:
            assert line not in text, f"{student}'s feedback shows the hidden test {line!r}"


@GRADES
@pytest.mark.parametrize("spec", params(SPECS))
def test_grading_writes_nothing_into_the_repository(spec, graded):
    assert not graded(spec).changed, "grading wrote into the repository's lab"


# ----------------------------------------------------------------------------- hostile cases


HOSTILE = [pytest.param(spec, case, marks=spec.marks, id=f"{spec.short}-{case.student_id}")
           for spec in SPECS for case in cases_for(spec.name)]


@GRADES
@pytest.mark.parametrize(("spec", "case"), HOSTILE)
def test_a_hostile_case_ends_as_the_bank_says(spec, case, graded):
    check_outcome(case, graded(spec).results[case.student_id])


# ----------------------------------------------------------------------------- Lab 1: the CLI


@GRADES
@pytest.mark.parametrize("spec", params([LAB1]))
def test_the_cli_prints_each_grade_and_exports_the_totals(spec, graded):
    batch = graded(spec)
    total = spec.assignment.total
    assert re.search(rf"(?m)^solution\s+{total:g} / {total:g}\b", batch.out), batch.out
    assert "ERROR" not in batch.out
    totals = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in batch.grades_csv}
    assert totals == {student: (sum(cells.values()), total)
                      for student, cells in batch.scores.items()}
    assert {row["lab"] for row in batch.grades_csv} == {spec.name}


# ----------------------------------------------------------------------------- Lab 3: ranks


@GRADES
@pytest.mark.parametrize("spec", params([LAB3]))
def test_no_process_a_ring_started_outlives_grading(spec, graded):
    batch = graded(spec)
    error = error_of(batch.tests["lab3_orphans"]["test_ring_all_reduce"])
    assert "the tensor passed in is unchanged" in error.evalue, "the ring did not get to return"
    assert not batch.left_behind, f"left behind: {batch.left_behind[:3]}"


@GRADES
@pytest.mark.parametrize("spec", params([LAB3]))
def test_a_ring_that_never_returns_is_stopped_and_explained(spec, graded):
    error = error_of(graded(spec).tests["lab3_stubborn"]["test_ring_all_reduce"])
    assert re.search(r"did not finish within 20 s, and every rank was stopped", error.evalue)


# ----------------------------------------------------------------------------- the quiz


def test_the_quiz_table_names_its_choice_questions_and_its_total():
    intro = QUIZ.lab.solution().cells[0].source
    table = re.findall(r"^\| (q\d\d) \| \d\d \| .* \| (choice|number) \| \d \|$", intro, re.M)
    assert [q for q, _ in table] == list(QUIZ.assignment.points)
    assert [q for q, kind in table if kind == "choice"] == list(QUIZ_CHOICE)
    assert f"{QUIZ.assignment.total:g} points in all" in intro


def test_the_quiz_learner_differs_from_the_release_only_in_answer_cells():
    release, learner = QUIZ.lab.released(), picked_and_written()
    changed = [grade_id(a) for a, b in zip(release.cells, learner.cells, strict=True)
               if a.source != b.source]
    assert changed == [f"{q}_answer" for q in QUIZ.assignment.points]


@GRADES
@pytest.mark.quiz
def test_answers_picked_with_the_buttons_and_written_down_get_full_marks(graded):
    """nbgrader runs the saved notebook again in a fresh kernel: what counts is the line the
    buttons showed, written into the answer cell."""
    batch = graded(QUIZ)
    assert batch.scores["picked_and_written"] == full_scores(QUIZ)
    assert not batch.results["picked_and_written"].flags


@GRADES
@pytest.mark.quiz
def test_a_click_alone_does_not_survive_grading_and_costs_that_question_only(graded):
    batch = graded(QUIZ)
    assert batch.scores["clicked_only"] == full_scores(QUIZ, {CLICKED_ONLY})
    error = error_of(batch.tests["clicked_only"][CLICKED_ONLY])
    assert error.ename == "AssertionError"
    assert f"{CLICKED_ONLY} is still None" in error.evalue and QUIZ.stub_hint in error.evalue


@GRADES
@pytest.mark.quiz
def test_patching_the_grader_earns_nothing_and_is_flagged(graded):
    batch = graded(QUIZ)
    result = batch.results["tampered"]
    assert batch.scores["tampered"]["q03"] == 0.0
    assert any("gpulab.checks.quiz.grade_pick" in flag for flag in result.flags), result.flags
    assert all(batch.scores["tampered"][q] == QUIZ.assignment.points[q] for q in ("q01", "q02"))


@GRADES
@pytest.mark.quiz
def test_the_quiz_feedback_gives_no_answer_away(graded):
    """A learner's page shows the answers they wrote, never one they did not: the untouched
    release's page has none of the solution's answer lines, and a wrong pick's message names
    the pick, not the answer."""
    batch = graded(QUIZ)
    solution = QUIZ.lab.solution()
    answers = [solution_region(cell_by_grade_id(solution, f"{q}_answer"))
               for q in QUIZ.assignment.points]
    _, untouched = batch.feedback["untouched"]
    shown = [line for line in answers if line in untouched]
    assert not shown, shown
    wrong = error_of(batch.tests[QUIZ.together]["q13"]).evalue
    assert '"d"' not in wrong
    _, page = batch.feedback[QUIZ.together]
    assert "grade_pick" not in page and "grade_number" not in page


@GRADES
@pytest.mark.quiz
def test_the_grader_saw_the_buttons_run_headless(graded):
    """The buttons' cells ran in the grading kernel (widgets with no frontend) and stored
    nothing: the test after each reads the answer cell's plain letter."""
    batch = graded(QUIZ)
    nb = read(Path(batch.results["picked_and_written"].autograded) / QUIZ.lab.notebook)
    for qid in QUIZ_CHOICE:
        cell = cell_by_grade_id(nb, f"{qid}_choices")
        (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert "Click a choice" in out.data["text/plain"], qid


# ----------------------------------------------------------------------------- the capstone


@pytest.mark.capstone
def test_the_capstone_release_holds_no_rubric_and_asks_for_an_answer():
    (written, _), = CAPSTONE.assignment.manual
    released = cell_by_grade_id(CAPSTONE.lab.released(), written)
    solution = cell_by_grade_id(CAPSTONE.lab.solution(), written)
    assert solution.cell_type == "markdown"
    assert "Rubric" in solution.source and "Rubric" not in released.source
    assert "YOUR ANSWER HERE" in released.source

