"""The checks every graded notebook's end-to-end grading must pass, written once: each
tests/test_grading_<notebook>.py imports them and names its spec (`SPEC = LAB3`), so that each
notebook's batch is a test module of its own, which `make test`'s workers share (--dist
loadfile). A notebook is graded as an instructor grades it: `python -m autograder grade` (cpu
profile with a busy runner's cell limit, sandboxed kernels, two at a time), `feedback` and
`export`, with the repository's own solution and release (tests/grading_specs.py: one spec
each). Not a test module itself (no `test_` prefix).

One batch per notebook, graded once and shared by its tests: the solution, the untouched
release, the spec's end-to-end mistakes (one notebook holding those in distinct parts), the
hostile bank's cases for that notebook (tests/hostile, selected by their `lab` field, so a case
added to the bank is graded here without more code), and the notebook's own learners (the
quiz's), graded once per module and shared by its tests.

Each check is written once, for every notebook: the points of its ASSIGNMENT table, full marks
for the solution, zero with the stub hint for the release, a mistake costs exactly its part and
its feedback teaches it, no hidden test reaches a feedback page, grading writes nothing into
the repository, the CLI's lines and export, each hostile case ends as the bank says. What is
particular to a notebook is in its own module: Lab 3's rings that leave processes behind or
never return, the quiz's buttons and answers, the capstone's written answer. Every known mistake
of the labs and the quiz also fails its checker in the checkers' own tests (tests/grading_specs.py
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
from grading_specs import SPECS, Spec
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
    marker = spec.leftover_marker  # this test process's own: another run's are not counted
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
    """graded(spec): that notebook's batch, graded the first time a test asks for it: once, as a
    notebook's tests are one module."""
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


@pytest.fixture(scope="module")
def spec(request) -> Spec:
    """The notebook of the module that imported these checks: its `SPEC`."""
    return request.module.SPEC


def pytest_generate_tests(metafunc):
    """The parameters of the module's spec: every known mistake (`known`), the learners of the
    end-to-end batch with their mistakes (`mistakes`, or each `mistake` with its learner), and
    the hostile bank's cases for the notebook (`case`)."""
    spec = getattr(metafunc.module, "SPEC", None)
    names = metafunc.fixturenames
    if spec is None:
        return
    if "known" in names:
        metafunc.parametrize("known", spec.mistakes, ids=lambda m: m.student_id)
    none = [pytest.param(None, None, id="none", marks=pytest.mark.skip(
        reason=f"no mistake is graded end to end: {spec.checker_tests} carries them"))]
    if "mistakes" in names:
        graded_mistakes = spec.graded_mistakes()
        metafunc.parametrize(("student", "mistakes"), [
            pytest.param(student, ms, id=student) for student, ms in graded_mistakes.items()]
            or none)
    if "mistake" in names:
        pairs = [pytest.param(student, m, id=m.student_id)
                 for student, ms in spec.graded_mistakes().items() for m in ms]
        metafunc.parametrize(("student", "mistake"), pairs or none)
    if "case" in names:
        metafunc.parametrize("case", cases_for(spec.name), ids=lambda case: case.student_id)


def test_every_graded_notebook_has_its_grading_module(spec):
    """Each spec of grading_specs has its tests/test_grading_<short>.py, which names it."""
    assert spec in SPECS
    for each in SPECS:
        module = Path(__file__).parent / f"test_grading_{each.short}.py"
        assert f"\nSPEC = {each.short.upper()}\n" in module.read_text(), module


# ----------------------------------------------------------------------------- the notebooks


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


def test_every_mistake_breaks_one_answer_cell_of_the_current_solution(spec, known):
    """Its text is found in the solution (with_mistake raises when not) and it changes exactly
    one answer cell; the test cells it fails are the notebook's."""
    assert len(spec.lab.cells_changed_by(known)) == 1
    assert {known.test, *known.also_fails} <= set(spec.assignment.points)


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


def test_mistakes_handed_in_together_are_in_distinct_parts(spec):
    """So that each one's score and message are its own, and at least one part is left right
    to show that the others cost nothing more."""
    assert len({m.student_id for m in spec.mistakes}) == len(spec.mistakes)
    handed_in = [m.student_id for ms in spec.graded_mistakes().values() for m in ms]
    assert sorted(handed_in) == sorted(spec.end_to_end), "each end-to-end mistake once"
    for mistakes in spec.graded_mistakes().values():
        failing = [t for m in mistakes for t in (m.test, *m.also_fails)]
        assert len(set(failing)) == len(failing), failing
        assert len({m.cell for m in mistakes}) == len(mistakes)
        assert set(spec.assignment.points) - set(failing), "no part is left right"


# ----------------------------------------------------------------------------- scores


@GRADES
def test_the_solution_gets_full_marks(spec, graded):
    batch = graded(spec)
    assert batch.scores["solution"] == full_scores(spec)
    assert not batch.results["solution"].flags, batch.results["solution"].flags
    assert batch.results["solution"].needs_manual_grade == len(spec.manual)


@GRADES
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
def test_grading_writes_nothing_into_the_repository(spec, graded):
    assert not graded(spec).run.changed, "grading wrote into the repository's lab"


# ----------------------------------------------------------------------------- hostile cases


@GRADES
def test_a_hostile_case_ends_as_the_bank_says(spec, case, graded):
    check_outcome(case, graded(spec).results[case.student_id])


# ----------------------------------------------------------------------------- the CLI


@GRADES
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


# What `from grading_checks import *` gives each notebook's module: the checks, their fixtures
# and the hook that parametrizes them by the module's SPEC.
__all__ = sorted(name for name in dir() if name.startswith("test_")) + [
    "graded", "pytest_generate_tests", "spec"]
