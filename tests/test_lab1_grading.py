"""Lab 1 graded end to end, as an instructor runs it: `python -m autograder grade`, `feedback` and
`export` on the cpu runner, with the repository's own solution and release.

Seven learners hand in: the full solution, the untouched release, and the solution with one part
broken the way learners break it (tests/lab1_submissions.py). They are graded in one batch, one
nbgrader kernel each (about 10 s apiece on the simulator), and the tests share the result.
"""

import contextlib
import csv
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from lab1_submissions import (
    LAB,
    LAB1,
    MISTAKES,
    NOTEBOOK,
    POINTS,
    ROOT,
    hand_in,
    hidden_test_lines,
    page_text,
    released,
    solution,
    with_mistake,
)
from nbgrader.api import Gradebook

from autograder.cli import main
from autograder.course import COURSE_ID, gradebook_url

pytestmark = [pytest.mark.lab1, pytest.mark.slow]

FULL_MARKS = 16  # the lab's introduction: 2 + 2 + 3 + 4 + 3 + 2
STUB_HINT = "Replace `raise NotImplementedError()` with your kernel's code."


@dataclass(frozen=True)
class Graded:
    grading: Path  # the nbgrader grading root (a tmp_path)
    out: str  # what `grade` printed
    scores: dict  # student -> {test grade_id: points}
    grades_csv: list  # the exported rows


def cli(argv) -> tuple[int, str]:
    """Run `python -m autograder ARGV` in this process: (exit status, stdout then stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


def digest(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def cell_scores(grading: Path, students) -> dict:
    with Gradebook(gradebook_url(grading), COURSE_ID) as gradebook:
        return {
            student: {
                grade.name: grade.score
                for grade in gradebook.find_submission_notebook(LAB, LAB, student).grades
            }
            for student in students
        }


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    tmp = tmp_path_factory.mktemp("lab1")
    subs, grading = tmp / "submissions", tmp / "grading"
    hand_in(subs, "solution", solution())
    hand_in(subs, "untouched", released())
    for mistake in MISTAKES:
        hand_in(subs, mistake.student_id, with_mistake(mistake))
    repo_before = digest(ROOT / "solutions" / LAB), digest(ROOT / "labs" / LAB)

    where = ["--root", str(ROOT), "--course-dir", str(grading)]
    code, out = cli(["grade", LAB, str(subs), *where])
    feedback_code, feedback_out = cli(["feedback", LAB, *where])
    grades_csv = tmp / "grades.csv"
    export_code, export_out = cli(["export", *where, "--output", str(grades_csv)])
    assert (code, feedback_code, export_code) == (0, 0, 0), out + feedback_out + export_out
    after = digest(ROOT / "solutions" / LAB), digest(ROOT / "labs" / LAB)
    assert after == repo_before, "grading wrote into the repository's lab"

    students = sorted(p.name for p in subs.iterdir())
    return Graded(grading, out, cell_scores(grading, students),
                  list(csv.DictReader(grades_csv.open())))


def autograded_tests(graded: Graded, student: str) -> dict:
    path = graded.grading / "autograded" / student / LAB / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if c.get("metadata", {})
            .get("nbgrader", {}).get("grade")}


def errors(cell) -> list:
    return [out for out in cell.outputs if out.output_type == "error"]


def feedback_text(graded: Graded, student: str) -> tuple[str, str]:
    """(the HTML page, its text as a reader sees it)."""
    page = (graded.grading / "feedback" / student / LAB / f"{LAB}.html").read_text()
    return page, page_text(page)


# ----------------------------------------------------------------------------- the lab itself


def test_the_lab_states_its_points_in_its_test_cells():
    LAB1.check_points(POINTS, FULL_MARKS)


def test_every_mistake_breaks_one_part_of_the_current_solution():
    """Each replacement is found in the solution (with_mistake raises when not) and changes
    exactly one answer cell."""
    assert len({m.student_id for m in MISTAKES}) == len(MISTAKES)
    assert len({m.test for m in MISTAKES}) == len(MISTAKES)
    for mistake in MISTAKES:
        assert len(LAB1.cells_changed_by(mistake)) == 1, mistake.student_id


# ----------------------------------------------------------------------------- scores


def test_the_solution_gets_full_marks(graded):
    assert graded.scores["solution"] == POINTS
    assert re.search(rf"(?m)^solution\s+{FULL_MARKS} / {FULL_MARKS}\b", graded.out), graded.out


def test_the_untouched_release_gets_zero_without_a_grader_error(graded):
    assert "ERROR" not in graded.out
    assert graded.scores["untouched"] == dict.fromkeys(POINTS, 0.0)
    cells = autograded_tests(graded, "untouched")
    for grade_id, cell in cells.items():
        (error,) = errors(cell)
        if grade_id == "test_waves":  # the answers are still None: the checker asks for numbers
            assert error.ename == "AssertionError", error.evalue
            assert "should be a number" in error.evalue
        else:
            assert error.ename == "AssertionError"
            assert "raised NotImplementedError" in error.evalue and STUB_HINT in error.evalue


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_a_mistake_costs_exactly_the_points_of_its_part(graded, mistake):
    want = {grade_id: 0.0 if grade_id == mistake.test else float(points)
            for grade_id, points in POINTS.items()}
    assert graded.scores[mistake.student_id] == want
    cells = autograded_tests(graded, mistake.student_id)
    (error,) = errors(cells[mistake.test])
    assert error.ename == "AssertionError"
    assert re.search(mistake.teaching, error.evalue), error.evalue


def test_export_has_the_totals(graded):
    totals = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in graded.grades_csv}
    want = {student: (sum(cells.values()), FULL_MARKS) for student, cells in graded.scores.items()}
    assert totals == want
    assert totals["solution"] == (FULL_MARKS, FULL_MARKS)
    assert {row["lab"] for row in graded.grades_csv} == {LAB}


# ----------------------------------------------------------------------------- feedback


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.student_id)
def test_feedback_teaches_the_mistake(graded, mistake):
    _, text = feedback_text(graded, mistake.student_id)
    assert re.search(mistake.teaching, text), f"{mistake.student_id}: no teaching"
    # The message comes from the failed test, not from the notebook's own prose or code.
    _, control = feedback_text(graded, "solution")
    assert not re.search(mistake.teaching, control)
    assert text.count("passed") >= len(POINTS) - 1


def test_no_feedback_page_shows_a_hidden_test(graded):
    hidden = hidden_test_lines()
    assert len(hidden) >= 8, "the lab's hidden tests were not found"
    for student in graded.scores:
        page, text = feedback_text(graded, student)
        assert "HIDDEN TESTS" not in page, student
        for line in hidden:
            assert line not in text, f"{student}'s feedback shows the hidden test {line!r}"
