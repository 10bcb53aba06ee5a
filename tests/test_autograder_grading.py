"""Grading end to end on the fixture lab: release, grade five learners through the CLI, write
feedback, export. One nbgrader kernel per submission (about 5 s each), shared by the tests."""

import contextlib
import csv
import hashlib
import io
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course
from autograder.grade import collect

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"
HIDDEN_CODE = ("[[5.0], [-1.0, 1.0, 4.0, 8.0]]", "secret-marker-7f3a", "[-3, -5, -1]", "[9, 1, 4]")
TEACHING = "Start from the first element, not from 0: all the numbers may be negative."


def edit(src: Path, dest: Path, change) -> None:
    nb = nbformat.read(src, as_version=4)
    change(nb)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


def start_from_zero(nb):
    """Part 2 wrong in a way only the hidden test sees (all-negative input)."""
    cell = next(c for c in nb.cells if c.get("id") == "running_max")
    cell.source = cell.source.replace("out, best = [], xs[0]", "out, best = [], 0")


def delete_tests_and_part_2(nb):
    """Part 1 right, part 2 left undone, and both test cells deleted."""
    nb.cells = [c for c in nb.cells if not c.get("id", "").startswith("test_")]
    cell = next(c for c in nb.cells if c.get("id") == "running_max")
    cell.source = "def running_max(xs):\n    return []"


def digest(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
        for p in sorted(folder.rglob("*")) if p.is_file()
    }


def run(argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    assert run(["release", LAB, "--root", str(root)])[0] == 0
    solution, released = root / "solutions" / LAB / NOTEBOOK, root / "labs" / LAB / NOTEBOOK
    subs = root.parent / f"{root.name}-submissions"
    (subs / "ada").mkdir(parents=True)
    shutil.copyfile(solution, subs / "ada" / NOTEBOOK)  # the answers, as a submission
    (subs / "bob" / LAB).mkdir(parents=True)  # nbgrader's own submitted layout
    shutil.copyfile(released, subs / "bob" / LAB / NOTEBOOK)  # handed in untouched
    edit(solution, subs / "cy" / NOTEBOOK, start_from_zero)
    edit(solution, subs / "dee" / NOTEBOOK, delete_tests_and_part_2)
    (subs / "eve").mkdir()
    shutil.copyfile(solution, subs / "eve" / NOTEBOOK)  # not asked for below
    for path in subs.rglob("*.ipynb"):
        path.chmod(0o444)  # a grader that writes to a submission fails loudly
    before, sources = digest(subs), digest(root / "solutions")

    students = [arg for s in ("ada", "bob", "cy", "dee") for arg in ("--student", s)]
    code, out = run(["grade", LAB, str(subs), "--root", str(root), *students])
    feedback_code, _ = run(["feedback", LAB, "--root", str(root)])
    csv_path = root / "grades.csv"
    export_code, _ = run(["export", "--root", str(root), "--output", str(csv_path)])
    assert (code, feedback_code, export_code) == (0, 0, 0), out
    assert digest(subs) == before, "a submission file was modified"
    assert digest(root / "solutions") == sources, "grading wrote into the lab sources"
    return root, out, list(csv.DictReader(csv_path.open()))


def grades(graded) -> dict:
    return {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in graded[2]}


def autograded(root: Path, student: str) -> dict:
    nb = nbformat.read(root / ".grading" / "autograded" / student / LAB / NOTEBOOK, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")}


def feedback(root: Path, student: str) -> str:
    return (root / ".grading" / "feedback" / student / LAB / f"{LAB}.html").read_text()


def test_the_solution_gets_full_marks(graded):
    assert grades(graded)["ada"] == (5.0, 5.0)


def test_the_untouched_release_gets_zero_without_a_grader_error(graded):
    root, out, _ = graded
    assert grades(graded)["bob"] == (0.0, 5.0)
    assert "ERROR" not in out and "bob" in out
    cells = autograded(root, "bob")
    assert {c.outputs[-1].ename for c in cells.values()} == {"NotImplementedError"}


def test_a_wrong_part_loses_exactly_its_points(graded):
    root, _, _ = graded
    assert grades(graded)["cy"] == (2.0, 5.0)
    cells = autograded(root, "cy")
    assert not any(o.output_type == "error" for o in cells["test_mean"].outputs)
    assert cells["test_running_max"].outputs[-1].ename == "AssertionError"


def test_deleted_test_cells_are_put_back_and_run(graded):
    assert grades(graded)["dee"] == (2.0, 5.0)


def test_only_the_students_asked_for_are_graded(graded):
    root, out, rows = graded
    assert [row["student_id"] for row in rows] == ["ada", "bob", "cy", "dee"]
    assert "eve" not in out
    assert not (root / ".grading" / "submitted" / "eve").exists()
    staged = collect(Course.at(root), LAB, None, [NOTEBOOK])  # what a rerun without a folder sees
    assert [s.student_id for s in staged] == ["ada", "bob", "cy", "dee"]


def test_feedback_teaches_without_giving_the_hidden_tests_away(graded):
    root, _, _ = graded
    page = feedback(root, "cy")
    assert TEACHING in page, "the checker's message is the feedback"
    assert "mean of small lists (2 points)" in page and "passed" in page
    not_for_learners = ("HIDDEN TESTS", "visible cases passed", "most recent call", "Cell In")
    for leak in HIDDEN_CODE + not_for_learners:
        assert leak not in page, f"{leak!r} in cy's feedback"
    page = feedback(root, "ada")
    assert page.count("<pre>passed\n</pre>") == 2
    for leak in HIDDEN_CODE:
        assert leak not in page, f"{leak!r} in ada's feedback"


def test_export_has_one_row_per_student_and_lab(graded):
    _, _, rows = graded
    assert list(rows[0]) == ["student_id", "lab", "score", "max_score", "needs_manual_grade",
                             "flags"]
    assert {row["lab"] for row in rows} == {LAB}
    assert all(row["needs_manual_grade"] == "no" for row in rows)
    flags = {row["student_id"]: row["flags"] for row in rows}
    assert flags == {"ada": "", "bob": "", "cy": "",
                     "dee": "restored cell: test_mean, test_running_max"}, "dee deleted both tests"
    assert grades(graded) == {"ada": (5, 5), "bob": (0, 5), "cy": (2, 5), "dee": (2, 5)}
