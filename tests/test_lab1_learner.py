"""Lab 1 as a new learner meets it: the released notebook, Part 1 filled in, every cell run.

The setup cell and every worked example run as they are, Part 1's visible test passes, and each
part still left as a stub fails its test with a message that says what to do, not a grader
error. Run on the cpu runner (the simulator), where a stub's NotImplementedError reaches the
checker; the kernel runs in a folder of its own, as a learner's copy of the notebook would.
"""

import os

import pytest
from lab_submissions import Lab, cell_by_grade_id, grade_id
from nbclient import NotebookClient

import gpulab.checks
from autograder.profiles import get_profile
from gpulab.env import GRADING_VARIABLE

pytestmark = pytest.mark.lab1

STUB = "    # YOUR CODE HERE\n    raise NotImplementedError()"
# A learner's own saxpy, written from the spec (not the solution's text).
MY_SAXPY = """\
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * x[i] + y[i]"""
STUB_HINT = "Replace `raise NotImplementedError()` with your kernel's code."
# Every part after Part 1 but the waves question: each kernel's value and technique tests.
STILL_STUBS = tuple(t for t in gpulab.checks.assignment("lab1_cuda_kernels").points
                    if t not in ("test_saxpy", "test_waves"))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = Lab("lab1_cuda_kernels").released()
    saxpy = cell_by_grade_id(nb, "saxpy")
    assert saxpy.source.count(STUB) == 1, "the released saxpy stub changed"
    saxpy.source = saxpy.source.replace(STUB, MY_SAXPY)
    folder = tmp_path_factory.mktemp("learner")
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    # The cpu runner's kernel environment, whatever machine runs this test, as a learner has it:
    # not grading, so the lab's progress cell checks the parts.
    env = get_profile("cpu").kernel_env(os.environ)
    del env[GRADING_VARIABLE]
    client.execute(env=env)
    return nb


def errors(cell) -> list:
    return [out for out in cell.get("outputs", []) if out.output_type == "error"]


def stdout(cell) -> str:
    return "".join(out.text for out in cell.outputs
                   if out.output_type == "stream" and out.name == "stdout")


def test_the_setup_cell_picks_the_simulator(executed):
    cell = cell_by_grade_id(executed, "imports")
    assert not errors(cell)
    assert "cpu runner; Numba's CUDA simulator" in stdout(cell)


def test_part_1_passes_its_visible_test(executed):
    cell = cell_by_grade_id(executed, "test_saxpy")
    assert cell.execution_count is not None, "the test cell did not run"
    assert not errors(cell), errors(cell)[0].evalue if errors(cell) else ""


def test_the_learners_own_try_it_cell_shows_the_right_numbers(executed):
    (cell,) = [c for c in executed.cells if c.cell_type == "code"
               and "saxpy[1, 4]" in c.source and grade_id(c) is None]
    assert not errors(cell)
    printed = [float(v) for v in stdout(cell).strip().strip("[]").split()]
    assert printed == [2.0 * v + 1.0 for v in range(10)]


@pytest.mark.parametrize("test_id", STILL_STUBS)
def test_an_unfinished_part_fails_with_the_stub_hint(executed, test_id):
    (error,) = errors(cell_by_grade_id(executed, test_id))
    assert error.ename == "AssertionError"
    assert "raised NotImplementedError" in error.evalue
    assert STUB_HINT in error.evalue


def test_the_unanswered_question_fails_in_its_own_cell(executed):
    (answer,) = errors(cell_by_grade_id(executed, "waves"))
    assert answer.ename == "NotImplementedError"
    (test,) = errors(cell_by_grade_id(executed, "test_waves"))
    assert test.ename == "AssertionError"
    assert "threads_per_block should be a number" in test.evalue and "None" in test.evalue


def test_only_the_unfinished_parts_fail(executed):
    """Every worked example runs as it is; nothing but the stubs and their tests raises."""
    failed = {grade_id(c) or c.get("id") for c in executed.cells
              if c.cell_type == "code" and errors(c)}
    assert failed == {*STILL_STUBS, "waves", "test_waves"}
    assert all(c.execution_count is not None for c in executed.cells if c.cell_type == "code")


def test_the_performance_report_shows_what_is_written_and_names_the_rest(executed):
    """The report runs with most kernels still stubs: saxpy gets its modeled line, each other
    kernel a line saying it was not traced, and why."""
    (cell,) = [c for c in executed.cells if c.get("id") == "report"]
    assert not errors(cell), errors(cell)[0].evalue if errors(cell) else ""
    text = stdout(cell)
    assert "MODELED on A100" in text
    (saxpy,) = [line for line in text.splitlines() if line.startswith("saxpy ")]
    assert "us" in saxpy and "not traced" not in saxpy
    for name in ("block_sum", "transpose", "matmul_tiled", "histogram", "stencil", "block_scan"):
        assert f"{name:<14}not traced (NotImplementedError" in text, name



def test_the_ready_progress_cell_shows_part_1_passing_and_the_rest_not_started(executed):
    (cell,) = [c for c in executed.cells if c.get("id") == "progress"]
    assert not errors(cell), errors(cell)[0].evalue if errors(cell) else ""
    # The report, beside tqdm's bar as it went part by part.
    (table,) = [out.data["text/plain"] for out in cell.outputs if out.output_type ==
                "display_data" and out.data["text/plain"].startswith("lab1_cuda_kernels:")]
    parts = len(gpulab.checks.assignment("lab1_cuda_kernels").parts)
    assert table.startswith(f"lab1_cuda_kernels: 1 of {parts} parts pass their visible tests")
    rows = {line.split()[0]: line for line in table.splitlines()[2:] if line[:1] != " "}
    assert rows["saxpy"].endswith("pass")
    assert [name for name, row in rows.items() if row.endswith("not started")] == [
        name for name in rows if name != "saxpy"]
