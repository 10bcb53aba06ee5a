"""Submissions that break the grader's assumptions: one kills its kernel, one never returns.
Neither may cost the other its grade, and the profile's cell timeout must apply. (The whole
bank of hostile submissions is in test_autograder_robustness.py and _integrity.py.)"""

import shutil
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from autograder.course import Course
from autograder.export import rows
from autograder.feedback import generate_feedback
from autograder.grade import grade
from autograder.profiles import get_profile

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"


def submit(root: Path, student: str, cell_id: str, source: str) -> None:
    nb = nbformat.read(root / "solutions" / LAB / NOTEBOOK, as_version=4)
    next(c for c in nb.cells if c.get("id") == cell_id).source = source
    (root / "subs" / student).mkdir(parents=True)
    nbformat.write(nb, root / "subs" / student / NOTEBOOK)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    submit(root, "fay", "running_max", "import os\nos._exit(3)  # the kernel dies")
    endless = "def mean(xs):\n    import time\n    while True:\n        time.sleep(0.05)"
    submit(root, "gus", "mean", endless)
    profile = replace(get_profile("cpu"), cell_timeout_s=5)
    course = Course.at(root)
    results = grade(course, LAB, root / "subs", profile, progress=False)
    return course, {r.student_id: r for r in results}


def test_a_dead_kernel_costs_that_submission_only_what_came_after(graded):
    course, results = graded
    fay = results["fay"]
    assert fay.ok and (fay.score, fay.max_score) == (2.0, 5.0), "test_mean ran before it died"
    assert "kernel died: running_max" in fay.flags
    assert any("exit status 3" in reason.reason for reason in fay.reasons)
    assert results["gus"].ok, "the next submission is graded as usual"
    assert [row.student_id for row in rows(course)] == ["fay", "gus"]


def test_a_cell_past_the_profile_timeout_fails_that_test(graded):
    course, results = graded
    assert (results["gus"].score, results["gus"].max_score) == (3.0, 5.0)
    (page,) = generate_feedback(course, LAB, "gus")
    assert "CellTimeoutError: the test ran past the time limit" in page.read_text()
