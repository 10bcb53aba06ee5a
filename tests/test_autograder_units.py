"""The autograder's pieces, without starting a kernel: profiles, scoring, feedback scrubbing,
finding submissions, the lab-folder rule, CSV rows. All fast."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from nbgrader.preprocessors import SaveAutoGrades

from autograder.cli import main
from autograder.course import (
    Course,
    CourseError,
    check_lab_name,
    check_student_id,
    failure_cause,
)
from autograder.export import COLUMNS, Row, to_csv
from autograder.feedback import (
    MAX_MESSAGE_CHARS,
    ScrubTestCells,
    describe,
    failure,
    hidden_lines,
    redact,
)
from autograder.profiles import PROFILES, ProfileError, get_profile
from autograder.scoring import SaveAutoGradesOnRaise, auto_score
from autograder.submissions import find_submissions, stage
from autograder.worker import CellComment, CellScore, GradeResult, GradeTask, autograde_config

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"

HIDDEN_TEST = '''"""block_sum of odd sizes (3 points)"""
check_block_sum(block_sum, sizes=[256])
### BEGIN HIDDEN TESTS
check_block_sum(block_sum, sizes=[1, 4097], seed=7)
assert block_sum_calls() == 2, "block_sum must launch exactly twice"
### END HIDDEN TESTS'''


def grade_cell(source=HIDDEN_TEST, outputs=(), points=3, grade_id="test_block_sum"):
    meta = {"nbgrader": {"grade": True, "solution": False, "locked": True,
                         "grade_id": grade_id, "points": points, "schema_version": 3}}
    cell = new_code_cell(source, metadata=meta)
    cell.outputs = list(outputs)
    return cell


def error(ename, evalue, traceback=("Traceback ...",)):
    return new_output("error", ename=ename, evalue=evalue, traceback=list(traceback))


# --- runner profiles ---------------------------------------------------------------------------

def test_profiles_set_the_runner_and_a_longer_timeout_on_the_simulator():
    cpu, gpu = get_profile("cpu"), get_profile("gpu")
    assert (cpu.name, gpu.name) == ("cpu", "gpu")
    assert cpu.cell_timeout_s > gpu.cell_timeout_s > 30, "nbgrader's 30 s is too short"
    with pytest.raises(AttributeError):  # frozen
        cpu.cell_timeout_s = 1
    env = cpu.kernel_env({"PATH": "/bin", "NUMBA_ENABLE_CUDASIM": "0", "GPULAB_RUNNER": "gpu"})
    assert env["GPULAB_RUNNER"] == "cpu" and env["PATH"] == "/bin"
    assert "NUMBA_ENABLE_CUDASIM" not in env, "the kernel's `import gpulab` decides the simulator"
    assert env["OMP_NUM_THREADS"] == "1", "kernels graded side by side must not oversubscribe"
    assert cpu.kernel_env({"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "1"
    assert gpu.kernel_env({})["GPULAB_RUNNER"] == "gpu"
    with pytest.raises(ProfileError, match="cpu, gpu"):
        get_profile("tpu")


def test_the_profile_timeout_and_scoring_rule_reach_nbgrader(tmp_path):
    from nbgrader.converters import Autograde

    task = GradeTask(LAB, "ada", "lab", "sub", str(tmp_path), cell_timeout_s=180)
    config = autograde_config(tmp_path, task)
    assert config.Execute.timeout == 180
    assert config.OverwriteCells.add_missing_cells, "deleted test cells come back"
    pipeline = Autograde(config=config).autograde_preprocessors
    assert SaveAutoGradesOnRaise in pipeline and SaveAutoGrades not in pipeline


def test_gpu_profile_refuses_a_machine_without_gpu():
    with pytest.raises(ProfileError, match="--runner cpu"):
        PROFILES["gpu"].check_available(gpu_count=lambda: 0)
    PROFILES["gpu"].check_available(gpu_count=lambda: 1)
    PROFILES["cpu"].check_available(gpu_count=lambda: 0)


def test_grade_on_gpu_without_gpu_fails_before_touching_anything(tmp_path, monkeypatch, capsys):
    import gpulab.env

    monkeypatch.setattr(gpulab.env, "nvidia_gpu_count", lambda: 0)
    grading = tmp_path / "grading"
    code = main(["grade", LAB, str(tmp_path), "--runner", "gpu",
                 "--root", str(FIXTURE.parent), "--course-dir", str(grading)])
    assert code == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert not grading.exists(), "nothing may be prepared for a run that cannot happen"


# --- scoring -----------------------------------------------------------------------------------

def test_a_test_cell_fails_only_when_it_raises():
    warned = new_output("stream", name="stderr", text="NumbaPerformanceWarning: Grid size 1\n")
    assert auto_score(grade_cell(outputs=[warned])) == (3.0, 3.0)
    assert auto_score(grade_cell(outputs=[warned, error("AssertionError", "no")])) == (0.0, 3.0)
    assert auto_score(grade_cell(outputs=[])) == (3.0, 3.0)
    partial = new_output("execute_result", data={"text/plain": "1.5"}, execution_count=1)
    assert auto_score(grade_cell(outputs=[partial])) == (1.5, 3.0)


# --- feedback scrubbing ------------------------------------------------------------------------

def test_hidden_lines_are_those_between_the_delimiters():
    assert hidden_lines(HIDDEN_TEST) == {
        "check_block_sum(block_sum, sizes=[1, 4097], seed=7)",
        'assert block_sum_calls() == 2, "block_sum must launch exactly twice"',
    }
    assert hidden_lines("check(1)\n") == set()


def test_redact_drops_lines_that_quote_hidden_tests_and_keeps_teaching():
    hidden = hidden_lines(HIDDEN_TEST)
    message = (
        "n=4097: block 16 gave 3.0000, expected 7.0000.\n"
        "while running check_block_sum(block_sum, sizes=[1, 4097], seed=7)\n"
        "block_sum must launch exactly twice\n"
        "If only the last block is wrong, check the `i < x.size` guard."
    )
    kept = redact(message, hidden)
    assert "n=4097: block 16 gave 3.0000" in kept
    assert "`i < x.size` guard" in kept
    assert "check_block_sum(block_sum" not in kept
    assert "launch exactly twice" not in kept, "a message copied from the hidden source"


def test_describe_uses_the_docstring_then_a_comment():
    assert describe(grade_cell()) == "block_sum of odd sizes (3 points)"
    assert describe(grade_cell("# reduce works (2 points)\ncheck(1)")) == "reduce works (2 points)"
    assert describe(grade_cell("check(1)", grade_id="t9")) == "test t9"
    readded = "# This cell (id:t) was missing from the submission.\n\n" + HIDDEN_TEST
    assert describe(grade_cell(readded)) == "block_sum of odd sizes (3 points)"


def test_failure_is_type_and_short_message_or_none():
    hidden = hidden_lines(HIDDEN_TEST)
    printed = new_output("stream", name="stdout", text="ok")
    assert failure(grade_cell(outputs=[printed]), hidden) is None
    long_error = error("\x1b[31mAssertionError\x1b[0m", "x" * 5000)
    ename, message = failure(grade_cell(outputs=[long_error]), hidden)
    assert ename == "AssertionError" and len(message) <= MAX_MESSAGE_CHARS + 10
    timed_out = [error("KeyboardInterrupt", ""), error("CellTimeoutError", "")]
    ename, message = failure(grade_cell(outputs=timed_out), hidden)
    assert ename == "CellTimeoutError" and "time limit" in message


def test_scrub_keeps_learner_outputs_and_reduces_test_cells_to_a_verdict():
    stdout = new_output("stream", name="stdout", text="visible part ok\nsecret-progress-line\n")
    teaching = "n=1: got 0.0, expected 2.5. Check the `i < x.size` guard."
    tb = ["\x1b[31mAssertionError\x1b[0m Traceback", "check_block_sum(block_sum, sizes=[1, 4097])"]
    learner_print = new_output(
        "stream", name="stdout",
        text="my result 42\ncheck_block_sum(block_sum, sizes=[1, 4097], seed=7)\n")
    colored = ("\x1b[32m----> 2\x1b[39m check_block_sum(\x1b[43mblock_sum\x1b[49m, "
               "sizes=[1, 4097], seed=7)")
    learner_error = error("ValueError", "bad", ["\x1b[31mValueError\x1b[39m Traceback", colored])
    nb = new_notebook(cells=[
        new_markdown_cell("# Lab"),
        new_code_cell("print(42)", outputs=[learner_print, learner_error]),
        grade_cell(outputs=[stdout, error("AssertionError", teaching, tb)]),
        grade_cell("check(1)", outputs=[stdout], points=2, grade_id="t2"),
    ])
    nb, _ = ScrubTestCells().preprocess(nb, {})
    learner, failed, passed = nb.cells[1], nb.cells[2], nb.cells[3]
    assert learner.outputs[0].text == "my result 42\n", "learner output minus the hidden test line"
    assert learner.outputs[1].traceback == ["\x1b[31mValueError\x1b[39m Traceback", ""]
    assert failed.source == "# block_sum of odd sizes (3 points)"
    assert [o.output_type for o in failed.outputs] == ["error"]
    assert failed.outputs[0].traceback == [f"AssertionError: {teaching}"]
    assert passed.outputs[0].text == "passed\n"
    text = json.dumps(nb)
    for leak in ("secret-progress-line", "seed=7", "sizes=[1, 4097]"):
        assert leak not in text


# --- course files and submissions --------------------------------------------------------------

def test_lab_folders_hold_notebooks_only(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "solutions")
    course = Course.at(tmp_path)
    assert [p.name for p in course.lab_notebooks(LAB)] == [f"{LAB}.ipynb"]
    (tmp_path / "solutions" / LAB / ".ipynb_checkpoints").mkdir()
    (tmp_path / "solutions" / LAB / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    assert len(course.lab_notebooks(LAB)) == 1, "editor leftovers are ignored"
    (tmp_path / "solutions" / LAB / "answers.py").write_text("SECRET = 1\n")
    with pytest.raises(CourseError, match="answers.py"):
        course.lab_notebooks(LAB)
    with pytest.raises(CourseError, match="lab9_nothing"):
        course.lab_notebooks("lab9_nothing")
    assert main(["release", LAB, "--root", str(tmp_path)]) == 2
    assert not (tmp_path / "labs").exists()


def test_the_cause_of_an_nbgrader_failure_is_found_in_its_log():
    log = (
        "There was an error processing assignment: /x/submitted/fay/lab0\n"
        "Traceback (most recent call last):\n"
        '  File "nbclient/client.py", line 1009, in async_execute_cell\n'
        "nbclient.exceptions.DeadKernelError: Kernel died\n"
        "nbgrader.converters.base.NbGraderException: Please see the the above traceback\n"
    )
    assert failure_cause(log) == "nbclient.exceptions.DeadKernelError: Kernel died"
    assert failure_cause("all fine\n") is None


def test_names_are_checked():
    assert check_lab_name("lab1_cuda_kernels") == "lab1_cuda_kernels"
    assert check_student_id("ada.lovelace@uni") == "ada.lovelace@uni"
    for bad in ("../x", "", ".hidden", "a b"):
        with pytest.raises(CourseError):
            check_student_id(bad)
    with pytest.raises(CourseError):
        check_lab_name("lab1/../x")
    course = Course.at("/srv/course")
    assert course.grading == Path("/srv/course/.grading") and course.labs.name == "labs"


def test_submissions_in_both_layouts(tmp_path):
    name = f"{LAB}.ipynb"
    (tmp_path / "ada").mkdir()
    (tmp_path / "ada" / name).write_text("{}")
    (tmp_path / "bob" / LAB).mkdir(parents=True)
    (tmp_path / "bob" / LAB / name).write_text("{}")
    (tmp_path / "bob" / LAB / "timestamp.txt").write_text("2025-01-01 10:00:00 UTC")
    (tmp_path / "cy").mkdir()  # nothing handed in
    (tmp_path / ".git").mkdir()
    found = find_submissions(tmp_path, LAB, [name])
    assert [s.student_id for s in found] == ["ada", "bob"]
    assert found[0].notebooks == (tmp_path / "ada" / name,) and found[0].timestamp is None
    assert found[1].timestamp == tmp_path / "bob" / LAB / "timestamp.txt"
    dest = stage(found[1], tmp_path / "staged")
    assert sorted(p.name for p in dest.iterdir()) == [name, "timestamp.txt"]
    assert (tmp_path / "bob" / LAB / name).read_text() == "{}"


# --- results and rows --------------------------------------------------------------------------

def test_grade_result_round_trips_through_json():
    result = GradeResult(
        LAB, "ada",
        scores=(CellScore(LAB, "t1", 2.0, 2.0, False), CellScore(LAB, "t2", None, 3.0, True)),
        comments=(CellComment(LAB, "mean", "No response."),),
        autograded="/x", seconds=1.5)
    back = GradeResult.from_json(result.to_json())
    assert back == result
    assert (back.score, back.max_score, back.needs_manual_grade) == (2.0, 5.0, 1)


def test_csv_has_a_row_per_student_and_lab_with_room_for_flags():
    text = to_csv([Row("ada", LAB, 5.0, 5.0, False), Row("bob", LAB, 2.5, 5.0, True, ("a", "b"))])
    lines = text.splitlines()
    assert lines[0] == ",".join(COLUMNS)
    assert lines[1:] == [f"ada,{LAB},5,5,no,", f"bob,{LAB},2.5,5,yes,a;b"]


def test_fixture_lab_is_an_nbgrader_source():
    nb = nbformat.read(FIXTURE / LAB / f"{LAB}.ipynb", as_version=4)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    points = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in graded}
    assert points == {"test_mean": 2, "test_running_max": 3}
    assert all(hidden_lines(c.source) for c in graded), "each part has a hidden test"


def test_a_new_gradebook_is_stamped_with_the_revision_alembic_names(tmp_path):
    """The revision read in-process (course.gradebook_schema_revision, which replaces nbgrader's
    `alembic heads` subprocess) is the one that command prints, and a new gradebook gets it."""
    import sqlite3
    import subprocess
    import sys

    from nbgrader.api import Gradebook, _temp_alembic_ini

    from autograder.course import gradebook_schema_revision, gradebook_url, prepare_nbgrader

    alembic = Path(sys.executable).parent / "alembic"
    with _temp_alembic_ini(gradebook_url(tmp_path)) as ini:
        heads = subprocess.check_output([str(alembic), "-c", ini, "heads"], text=True)
    assert heads.split()[0] == gradebook_schema_revision()
    prepare_nbgrader()
    with Gradebook(gradebook_url(tmp_path)):
        pass
    with sqlite3.connect(tmp_path / "gradebook.db") as db:
        stamped = db.execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamped == [(gradebook_schema_revision(),)]
