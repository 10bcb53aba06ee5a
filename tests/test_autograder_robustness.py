"""Broken submissions end as clear results: graded what could be graded, the rest zero with a
reason the instructor sees, and the rest of the batch graded.

The bank's robustness cases (tests/hostile/cases.py) are graded in one batch on the fixture lab
with a 5 s cell timeout; each case's outcome is asserted. A second test runs the executor alone
on a notebook that prints gigabytes, to measure the grader's own memory.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from hostile import ROBUSTNESS, check_outcome, hand_in_all

from autograder.cells import admit_submission
from autograder.course import Course
from autograder.execute import GradeExecute
from autograder.export import rows
from autograder.grade import grade
from autograder.profiles import get_profile

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
CELL_LIMIT = 1_000_000  # GradeExecute's default cell_output_limit


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    subs = hand_in_all(root / "subs", ROBUSTNESS)
    course = Course.at(root)
    profile = replace(get_profile("cpu"), cell_timeout_s=5)
    # Two at a time, as instructors grade: the cases that hang wait out their 5 s side by side.
    results = grade(course, LAB, subs, profile, progress=False, jobs=2)
    return course, {result.student_id: result for result in results}


@pytest.mark.slow
@pytest.mark.parametrize("case", ROBUSTNESS, ids=lambda case: case.student_id)
def test_outcome(batch, case):
    check_outcome(case, batch[1][case.student_id])


@pytest.mark.slow
def test_every_graded_submission_is_recorded_and_only_those(batch):
    course, results = batch
    graded = sorted(student for student, result in results.items() if result.ok)
    assert [row.student_id for row in rows(course)] == graded
    assert {"corrupt", "not_nb"}.isdisjoint(graded) and "bea" in graded


@pytest.mark.slow
def test_a_flood_is_cut_with_a_note(batch):
    course, _ = batch
    nb = nbformat.read(course.grading / "autograded" / "flood" / LAB / f"{LAB}.ipynb",
                       as_version=4)
    flooding = nb.cells[4]  # the cell the flood case adds after `mean`
    assert "print(" in flooding.source
    kept = sum(len(out.get("text", "")) for out in flooding.outputs)
    assert 0.5 * CELL_LIMIT < kept <= CELL_LIMIT
    assert "dropped the rest" in str(flooding.outputs[-1])


EXECUTE_ALONE = textwrap.dedent("""
    import json, resource, sys
    import nbformat
    from autograder.execute import GradeExecute

    nb = nbformat.read(sys.argv[1], as_version=4)
    nb, _ = GradeExecute(timeout=60).preprocess(nb, {"metadata": {"path": sys.argv[2]}})
    print(json.dumps({
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "outputs": [[dict(o) for o in c.outputs] for c in nb.cells],
        "flags": nb.metadata["gpulab_grading"]["flags"],
    }))
""")


@pytest.mark.slow
def test_gigabytes_of_output_cost_the_grader_bounded_memory(tmp_path):
    """2 GB printed in 1 MB lines, then 200 MB written in one message past the kernel's own cap:
    the grader's peak memory stays far below either, and the cell after them still runs."""
    cells = [
        'for _ in range(2048):\n    print("x" * (1 << 20))',
        "import sys\nsys.stdout.__class__.write(sys.stdout, 'y' * (200 << 20))\nsys.stdout.flush()",
        'print("still graded")',
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "flood.ipynb")
    done = subprocess.run([sys.executable, "-c", EXECUTE_ALONE, str(tmp_path / "flood.ipynb"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    flood, burst, after = report["outputs"]
    assert sum(len(out.get("text", "")) for out in flood) <= CELL_LIMIT
    assert any(out.get("ename") == "OutputLimitError" for out in burst)
    assert after == [{"output_type": "stream", "name": "stdout", "text": "still graded\n"}]
    assert any(flag.startswith("output capped") for flag in report["flags"])
    # Stored, the output would take over 2 GB. The peak varies with load (how far the grader
    # lags behind the kernel: ~120 MB idle, ~700 MB on a busy 2-core machine); what must hold is
    # that it does not grow with the output.
    assert report["peak_mb"] < 1024, f"the grader peaked at {report['peak_mb']:.0f} MB"


# ----------------------------------------------------------------------------- quick pieces


def test_admission_repairs_what_nbgrader_would_crash_on(tmp_path):
    """A test handed in twice and a forged test cell: nbgrader 0.9's autograde raises KeyError
    on either; admission leaves one graded copy, drops the forgery, and says so."""
    cases = {case.student_id: case for case in ROBUSTNESS}
    hand_in_all(tmp_path, [cases["twice"], cases["forged"], cases["deleted"], cases["corrupt"]])
    source = FIXTURE / LAB
    for student, flag in [("twice", "duplicated cell: test_mean"),
                          ("forged", "ignored cell metadata: cell 9"),
                          ("deleted", "restored cell: test_running_max")]:
        intake = admit_submission(tmp_path / student, source)
        assert intake.unreadable == {} and intake.record.flag_lines() == [flag]
        nb = nbformat.read(tmp_path / student / f"{LAB}.ipynb", as_version=4)
        ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
        assert len(ids) == len(set(ids)) and "test_bonus" not in ids
    intake = admit_submission(tmp_path / "corrupt", source)
    assert "invalid JSON" in intake.unreadable[f"{LAB}.ipynb"]


def message(msg_type: str, **content) -> dict:
    return {"header": {"msg_type": msg_type}, "msg_type": msg_type,
            "parent_header": {"msg_id": "m"}, "content": content}


def test_output_caps_cut_streams_but_keep_errors():
    executor = GradeExecute(cell_output_limit=100, notebook_output_limit=250)
    executor.reset_output_caps(notebook=True)
    executor.clear_before_next_output = False  # nbclient's, set per cell when it runs one
    outs = []
    for _ in range(3):
        executor.output(outs, message("stream", name="stdout", text="x" * 60), None, 0)
    assert [len(out.text) for out in outs] == [60, 40] and executor.capped
    assert "this cell's output" in executor.cap_note()
    executor.reset_output_caps()
    executor.output(outs, message("stream", name="stdout", text="z" * 200), None, 1)
    assert outs[-1].text == "z" * 100
    executor.reset_output_caps()
    executor.output(outs, message("stream", name="stdout", text="w" * 100), None, 2)
    assert outs[-1].text == "w" * 50, "what the notebook's budget has left"
    executor.reset_output_caps()
    huge = message("error", ename="AssertionError", evalue="y" * 50_000, traceback=[])
    executor.output(outs, huge, None, 3)
    assert outs[-1].ename == "AssertionError", "scoring needs the error, whatever the budget"
    assert len(outs[-1].evalue) < 11_000
    assert executor.output(outs, message("stream", name="stdout", text="v"), None, 3) is None
    assert "this notebook's output" in executor.cap_note()


def test_a_failed_reply_fails_the_cell_even_when_its_error_output_was_lost():
    """Output can be dropped under a flood; the cell's reply cannot. An error reply with no
    error output must still leave an error in the cell, where scoring looks."""
    from jupyter_core.utils import run_sync

    executor = GradeExecute(timeout=60)
    cell = nbformat.v4.new_code_cell("check()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10)]
    reply = {"content": {"status": "error", "ename": "AssertionError", "evalue": "wrong",
                         "traceback": ["AssertionError: wrong"]}}
    run_sync(executor._check_raise_for_error)(cell, 0, reply)
    errors = [out for out in cell.outputs if out.output_type == "error"]
    assert [(e.ename, e.evalue) for e in errors] == [("AssertionError", "wrong")]

    run_sync(executor._check_raise_for_error)(cell, 0, reply)  # already there: not doubled
    assert sum(out.output_type == "error" for out in cell.outputs) == 1
