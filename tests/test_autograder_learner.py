"""Whose notebook it is (autograder/learner.py): the learner a notebook names, the grading
kernel's JUPYTERHUB_USER, and a notebook written for another learner refused without running.
End to end, through nbgrader: the quiz's hostile case "quiz_other_learner" (tests/hostile) and
tests/test_grading_quiz.py.
"""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.execute import METADATA_KEY, GradeExecute
from autograder.learner import HUB_USER, kernel_environment, named_learners, other_learner
from autograder.sandbox_kernel import kernel_environment as sandboxed_environment


def notebook(*sources: str) -> nbformat.NotebookNode:
    return new_notebook(cells=[new_code_cell(source) for source in sources])


def test_a_notebook_names_its_learner_with_a_plain_string():
    nb = notebook('LEARNER = ""  # empty: the hub user', 'x = 1', 'LEARNER = " ada "',
                  '%time y = 2\nLEARNER: str = "grace"', 'LEARNER = "b" + "ob"',
                  'def f():\n    LEARNER = "nested"')
    nb.cells.insert(1, new_markdown_cell('LEARNER = "prose"'))
    assert named_learners(nb) == [(3, "ada"), (4, "grace")]
    assert other_learner(nb, "ada") == (4, "grace")
    assert other_learner(notebook('LEARNER = "ada"'), "ada") is None
    assert other_learner(notebook('LEARNER = ""', "print(LEARNER)"), "ada") is None


def test_the_kernel_is_the_students_hub_session_never_the_graders():
    grader = {"JUPYTERHUB_USER": "instructor", "GPULAB_RUNNER": "cpu"}
    assert kernel_environment(grader, "ada") == {HUB_USER: "ada", "GPULAB_RUNNER": "cpu"}
    assert kernel_environment(grader, None) == {"GPULAB_RUNNER": "cpu"}
    # The sandbox passes it on, as it passes the runner profile's variables.
    assert sandboxed_environment(kernel_environment(grader, "ada"), "/home/learner",
                                 "/tmp")[HUB_USER] == "ada"


def graded_notebook(learner_line: str) -> nbformat.NotebookNode:
    """A learner's cell naming a learner, and one test cell worth 2 points."""
    nb = notebook(learner_line, "assert True")
    nb.cells[1].metadata["nbgrader"] = {"grade": True, "grade_id": "test_one", "locked": True,
                                        "points": 2, "schema_version": 3, "solution": False}
    return nb


def test_a_notebook_written_for_another_learner_is_not_run(monkeypatch):
    """Each test gets the reason as its error (zero points, and the feedback says why), the
    notebook a flag; no kernel starts."""
    async def no_kernel(self):
        raise AssertionError("a kernel was started for a notebook that must not run")

    monkeypatch.setattr(GradeExecute, "_start_kernel", no_kernel)
    nb, _ = GradeExecute().preprocess(graded_notebook('LEARNER = "ada"'),
                                      {"nbgrader": {"student": "bob"}})
    (error,) = nb.cells[1].outputs
    assert error.ename == "LearnerMismatch"
    assert 'written for another learner (LEARNER = "ada"), but bob handed it in' in error.evalue
    assert nb.metadata[METADATA_KEY]["flags"] == ["learner mismatch: ada"]
    (reason,) = nb.metadata[METADATA_KEY]["reasons"]
    assert reason["cell"] == "cell 1" and "each test scores zero" in reason["reason"]


@pytest.mark.parametrize("line", ['LEARNER = "bob"', 'LEARNER = ""'])
def test_a_notebook_of_the_student_runs(monkeypatch, line):
    started = []

    async def note_kernel(self):
        started.append(True)
        raise RuntimeError("stop here")

    monkeypatch.setattr(GradeExecute, "_start_kernel", note_kernel)
    with pytest.raises(RuntimeError, match="stop here"):
        GradeExecute().preprocess(graded_notebook(line), {"nbgrader": {"student": "bob"}})
    assert started
