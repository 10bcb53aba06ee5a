"""Every graded notebook graded end to end, as an instructor grades it: `python -m autograder
grade` (cpu profile with a busy runner's cell limit, sandboxed kernels, two at a time),
`feedback` and `export`, with the repository's own solution and release, for the five labs, the
quiz and the capstone (tests/grading_specs.py: one spec each).

One batch per notebook, graded once and shared by its tests: the solution, the untouched
release, the spec's end-to-end mistakes (one notebook holding those in distinct parts), the
hostile bank's cases for that notebook (tests/hostile, selected by their `lab` field, so a case
added to the bank is graded here without more code), and the notebook's own learners (the
quiz's). Each notebook's tests are one xdist group (tests/conftest.py), so `make test` grades
the batches on both workers, the longest first.

Each check is written once, for every notebook: the points of its ASSIGNMENT table, full marks
for the solution, zero with the stub hint for the release, a mistake costs exactly its part and
its feedback teaches it, no hidden test reaches a feedback page, grading writes nothing into
the repository, the CLI's lines and export, each hostile case ends as the bank says. What is
particular to a notebook follows at the end: Lab 3's rings that leave processes behind or never
return, the quiz's buttons and answers, the capstone's written answer. Every known mistake of
the labs and the quiz also fails its checker in the checkers' own tests (tests/grading_specs.py
says which).
"""

from __future__ import annotations

import csv
import hashlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from grading_specs import (
    CAPSTONE,
    CLICKED_ONLY,
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
from autograder.course import Course
from autograder.grade import grade

JOBS = 2  # kernels at once in one notebook's batch (`grade --jobs 2`)
# Two batches grade at once on a 2-core machine, four kernels each starting ranks: a cell that
# takes a minute alone (the capstone's run) can take four. A shared runner's setting.
CELL_TIMEOUT_S = 600
CLI_TIMEOUT_S = 3600  # a whole batch; the grader's own limits stop a stuck kernel long before
GRADES = pytest.mark.slow  # each notebook's batch is minutes on a 2-core machine


@dataclass(frozen=True)
class Run:
    """What the CLI did with one notebook's batch, as an instructor runs it."""

    submissions: Path  # one folder per learner
    grading: Path  # the grading root (--course-dir)
    out: str  # what `grade` printed
    grades_csv: tuple  # the rows `export` wrote
    changed: list  # files of the repository's solutions/<lab> and labs/<lab> that changed
    left_behind: list  # command lines of processes of the batch still alive after grading


@dataclass(frozen=True)
class Graded:
    """One notebook's batch, graded."""

    run: Run
    results: dict  # student -> the grader's GradeResult
    scores: dict  # student -> {grade_id: points, None for a cell a person grades}
    tests: dict  # student -> {grade_id: the autograded test cell}
    feedback: dict  # student -> (the HTML page, its text as a reader sees it)


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


def cli(*args) -> tuple[int, str]:
    """`python -m autograder ARGS`, as an instructor runs it: (exit status, what it printed)."""
    done = subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def is_the_solution(case) -> bool:
    """A case that hands in the lab's own solution unchanged ("nothing: the lab's own
    solution"): the batch's "solution" is that notebook, graded once for both."""
    return case.base == "solution" and not (case.code or case.answers or case.edit or case.raw)


def expected_errors(spec: Spec) -> set[str]:
    """The learners of the batch who get no grade, by the bank's word (an unreadable file)."""
    return {case.student_id for case in cases_for(spec.name) if case.error}


def hand_in(spec: Spec, folder: Path) -> None:
    lab = spec.lab
    lab.hand_in(folder, "solution", lab.solution())
    lab.hand_in(folder, "untouched", lab.released())
    for student, mistakes in spec.graded_mistakes().items():
        lab.hand_in(folder, student, spec.with_mistakes(mistakes))
    hand_in_all(folder, [case for case in cases_for(spec.name) if not is_the_solution(case)])
    if spec.extra is not None:
        spec.extra(folder)


def run_batch(spec: Spec, tmp: Path) -> Run:
    """Hand in the batch and grade it with the CLI, as the README tells instructors: grade,
    feedback and export."""
    subs, grading = tmp / "submissions", tmp / "grading"
    hand_in(spec, subs)
    marker = spec.leftover_marker
    assert marker is None or not alive_with(marker), "processes of an earlier run are alive"
    repo = ROOT / "solutions" / spec.name, ROOT / "labs" / spec.name
    before = digest(*repo)
    where = ["--root", ROOT, "--course-dir", grading]
    code, out = cli("grade", spec.name, subs, *where, "--jobs", JOBS, "--cell-timeout",
                    CELL_TIMEOUT_S)
    left_behind = alive_with(marker) if marker else []
    assert code == (1 if expected_errors(spec) else 0), out
    feedback_code, feedback_out = cli("feedback", spec.name, *where)
    export_code, export_out = cli("export", *where, "--output", tmp / "grades.csv")
    assert (feedback_code, export_code) == (0, 0), feedback_out + export_out
    changed = sorted(set(before.items()) ^ set(digest(*repo).items()))
    return Run(subs, grading, out, tuple(csv.DictReader((tmp / "grades.csv").open())),
               [path for path, _ in changed], left_behind)


def collect(spec: Spec, run: Run) -> Graded:
    """The batch's results, autograded notebooks and feedback pages, read back from the
    grading root. A learner the CLI gave no grade (an unreadable notebook) is graded again
    here, so that the bank's expectation is checked on the whole result."""
    students = sorted(folder.name for folder in run.submissions.iterdir())
    results = {}
    for student in students:
        record = gradebook.recorded(run.grading, spec.name, student)
        if record is not None:
            results[student] = record.grade_result(run.grading)
    missing = [student for student in students if student not in results]
    if missing:
        course = Course.at(ROOT, run.grading)
        results.update({r.student_id: r for r in grade(course, spec.name, run.submissions,
                                                       students=missing, progress=False)})
    print(f"{spec.short}: seconds per submission:",
          {student: round(r.seconds) for student, r in results.items()})
    errors = {s: r.error for s, r in results.items() if not r.ok and s not in expected_errors(spec)}
    assert not errors, f"the grader failed on: {errors}"

    graded_cells = {**spec.assignment.points, **spec.manual}
    scores, tests, feedback = {}, {}, {}
    for student, result in results.items():
        if not result.ok:
            continue
        scores[student] = {c.grade_id: c.auto_score for c in result.scores}
        nb = read(Path(result.autograded) / spec.lab.notebook)
        tests[student] = {grade_id(c): c for c in nb.cells if grade_id(c) in graded_cells}
        page = (run.grading / "feedback" / student / spec.name / f"{spec.name}.html").read_text()
        feedback[student] = (page, page_text(page))
    results.update({case.student_id: results["solution"]
                    for case in cases_for(spec.name) if is_the_solution(case)})
    return Graded(run, results, scores, tests, feedback)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """graded(spec): that notebook's batch, graded the first time a test asks for it (once:
    a notebook's tests run on one worker)."""
    done: dict[str, Graded | BaseException] = {}

    def batch(spec: Spec) -> Graded:
        if spec.name not in done:
            try:  # each test of this notebook fails with the batch's error, not again
                run = run_batch(spec, tmp_path_factory.mktemp(spec.short))
                done[spec.name] = collect(spec, run)
            except Exception as error:
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
    assert not graded(spec).run.changed, "grading wrote into the repository's lab"


# ----------------------------------------------------------------------------- hostile cases


HOSTILE = [pytest.param(spec, case, marks=spec.marks, id=f"{spec.short}-{case.student_id}")
           for spec in SPECS for case in cases_for(spec.name)]


@GRADES
@pytest.mark.parametrize(("spec", "case"), HOSTILE)
def test_a_hostile_case_ends_as_the_bank_says(spec, case, graded):
    check_outcome(case, graded(spec).results[case.student_id])


# ----------------------------------------------------------------------------- the CLI


@GRADES
@pytest.mark.parametrize("spec", params(SPECS))
def test_the_cli_prints_each_grade_and_exports_the_totals(spec, graded):
    """`grade` prints a line per learner (an error only for those the bank says get no grade)
    and `export` a row per graded learner: the autograded score out of the notebook's total,
    whether a person still has to grade a cell, and the result's flags."""
    batch = graded(spec)
    autograded, total = sum(spec.assignment.points.values()), spec.assignment.total
    assert re.search(rf"(?m)^solution\s+{autograded:g} / {total:g}\b", batch.run.out)
    failed = set(re.findall(r"(?m)^(\S+)\s+ERROR\b", batch.run.out))
    assert failed == expected_errors(spec), batch.run.out
    rows = {row["student_id"]: row for row in batch.run.grades_csv}
    assert set(rows) == set(batch.scores)
    assert {row["lab"] for row in rows.values()} == {spec.name}
    for student, cells in batch.scores.items():
        row, result = rows[student], batch.results[student]
        assert float(row["score"]) == sum(p for p in cells.values() if p is not None), student
        assert float(row["max_score"]) == total, student
        assert row["needs_manual_grade"] == ("yes" if result.needs_manual_grade else "no")
        assert row["flags"] == ";".join(result.flags), student
    assert rows["solution"]["needs_manual_grade"] == ("yes" if spec.manual else "no")


# ----------------------------------------------------------------------------- Lab 3: ranks


@GRADES
@pytest.mark.parametrize("spec", params([LAB3]))
def test_no_process_a_ring_started_outlives_grading(spec, graded):
    batch = graded(spec)
    error = error_of(batch.tests["lab3_orphans"]["test_ring_all_reduce"])
    assert "the tensor passed in is unchanged" in error.evalue, "the ring did not get to return"
    assert not batch.run.left_behind, f"left behind: {batch.run.left_behind[:3]}"


@GRADES
@pytest.mark.parametrize("spec", params([LAB3]))
def test_a_ring_that_never_returns_is_stopped_and_explained(spec, graded):
    error = error_of(graded(spec).tests["lab3_stubborn"]["test_ring_all_reduce"])
    assert re.search(r"did not finish within 20 s, and every rank was stopped", error.evalue)


# ----------------------------------------------------------------------------- the quiz


@pytest.mark.quiz
def test_the_quiz_table_names_its_choice_questions_and_its_total():
    intro = QUIZ.lab.solution().cells[0].source
    table = re.findall(r"^\| (q\d\d) \| \d\d \| .* \| (choice|number) \| \d \|$", intro, re.M)
    assert [q for q, _ in table] == list(QUIZ.assignment.points)
    assert [q for q, kind in table if kind == "choice"] == list(QUIZ_CHOICE)
    assert f"{QUIZ.assignment.total:g} points in all" in intro


@pytest.mark.quiz
def test_the_quiz_learner_differs_from_the_release_only_in_answer_cells():
    release, learner = QUIZ.lab.released(), picked_and_written()
    changed = [grade_id(a) for a, b in zip(release.cells, learner.cells, strict=True)
               if a.source != b.source]
    assert changed == [f"{q}_answer" for q in QUIZ.assignment.points]


@GRADES
@pytest.mark.parametrize("spec", params([QUIZ]))
def test_answers_picked_with_the_buttons_and_written_down_get_full_marks(spec, graded):
    """nbgrader runs the saved notebook again in a fresh kernel: what counts is the line the
    buttons showed, written into the answer cell."""
    batch = graded(spec)
    assert batch.scores["picked_and_written"] == full_scores(spec)
    assert not batch.results["picked_and_written"].flags


@GRADES
@pytest.mark.parametrize("spec", params([QUIZ]))
def test_a_click_alone_does_not_survive_grading_and_costs_that_question_only(spec, graded):
    batch = graded(spec)
    assert batch.scores["clicked_only"] == full_scores(spec, {CLICKED_ONLY})
    error = error_of(batch.tests["clicked_only"][CLICKED_ONLY])
    assert error.ename == "AssertionError"
    assert f"{CLICKED_ONLY} is still None" in error.evalue and spec.stub_hint in error.evalue


@GRADES
@pytest.mark.parametrize("spec", params([QUIZ]))
def test_patching_the_grader_earns_nothing_and_is_flagged(spec, graded):
    batch = graded(spec)
    result = batch.results["tampered"]
    assert batch.scores["tampered"]["q03"] == 0.0
    assert any("gpulab.checks.quiz.grade_pick" in flag for flag in result.flags), result.flags
    assert all(batch.scores["tampered"][q] == spec.assignment.points[q] for q in ("q01", "q02"))


@GRADES
@pytest.mark.parametrize("spec", params([QUIZ]))
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
    wrong = error_of(batch.tests[spec.together]["q13"]).evalue
    assert '"d"' not in wrong
    _, page = batch.feedback[spec.together]
    assert "grade_pick" not in page and "grade_number" not in page


@GRADES
@pytest.mark.parametrize("spec", params([QUIZ]))
def test_the_grader_saw_the_buttons_run_headless(spec, graded):
    """The buttons' cells ran in the grading kernel (widgets with no frontend) and stored
    nothing: the test after each reads the answer cell's plain letter."""
    batch = graded(spec)
    nb = read(Path(batch.results["picked_and_written"].autograded) / spec.lab.notebook)
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

