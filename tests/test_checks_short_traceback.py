"""A checker's failure in a notebook: the teaching message first, the learner's line, and none of
the checker's or the simulator's frames (gpulab/checks/harness/short_traceback.py).

The notebook runs in a real kernel (nbclient) on the cpu runner, as a learner's would: a stub and
a wrong saxpy (Lab 1), a stub to_device (Lab 2). Each test cell must still fail with an error
output, as nbgrader scores it, and the feedback page must quote the same short message.
"""

import copy
import os
import re

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

import gpulab
from autograder.feedback import ScrubTestCells
from autograder.profiles import get_profile
from gpulab.checks.harness.short_traceback import (
    install_in_ipython,
    is_learners,
    learner_line,
    short_traceback,
)
from gpulab.stubs import is_stub_error

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MAX_LINES = 12
# What only IPython's full traceback shows: the checker's and the simulator's frames.
INTERNALS = ("threading.py", "numba", "simulator", "gpulab/checks", "harness", "Traceback")

SETUP = "import gpulab\nfrom numba import cuda\nimport numpy as np"
STUB_SAXPY = '''\
@cuda.jit
def saxpy(out, a, x, y):
    """out[i] = a * x[i] + y[i] for every i < out.size, with a grid-stride loop."""
    # YOUR CODE HERE
    raise NotImplementedError()'''
SWAPPED_SAXPY = '''\
@cuda.jit
def saxpy(out, a, x, y):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * y[i] + x[i]'''
TEST_SAXPY = "from gpulab.checks.lab1 import check_saxpy\n\ncheck_saxpy(saxpy, sizes=[2048, 5000])"
STUB_TO_DEVICE = '''\
def to_device(batch, device):
    """batch (a tensor, or dicts/lists/tuples of them) moved to device, asynchronously."""
    # YOUR CODE HERE
    raise NotImplementedError()'''
TEST_TO_DEVICE = "from gpulab.checks.lab2 import check_to_device\n\ncheck_to_device(to_device)"
CELLS = {  # id -> source, in the notebook's order
    "setup": SETUP,
    "stub_saxpy": STUB_SAXPY, "test_stub_saxpy": TEST_SAXPY,
    "swapped_saxpy": SWAPPED_SAXPY, "test_swapped_saxpy": TEST_SAXPY,
    "full_traceback": "%tb",
    "own_assert": 'assert 1 + 1 == 3, "my own check"',
    "stub_to_device": STUB_TO_DEVICE, "test_stub_to_device": TEST_TO_DEVICE,
}
TESTS = ("test_stub_saxpy", "test_swapped_saxpy", "test_stub_to_device")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    cells = [new_code_cell(source, id=cell_id.replace("_", "-")) for cell_id, source
             in CELLS.items()]
    nb = new_notebook(cells=cells)
    for cell_id, cell in zip(CELLS, cells, strict=True):
        if cell_id in TESTS:  # as nbgrader marks a lab's test cells
            cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                         "grade_id": cell_id, "points": 2}
    folder = tmp_path_factory.mktemp("learner")
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env=get_profile("cpu").kernel_env(os.environ))  # the simulator, as on CPU
    return {cell_id: cell for cell_id, cell in zip(CELLS, nb.cells, strict=True)}


def error_of(cell):
    (error,) = [out for out in cell.outputs if out.output_type == "error"]
    return error


def shown(cell) -> list[str]:
    """The error's traceback as the notebook shows it, one line per entry, colors removed."""
    return ANSI.sub("", "\n".join(error_of(cell).traceback)).splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("test", TESTS)
def test_a_failed_check_still_fails_its_cell_in_a_few_lines(executed, test):
    lines = shown(executed[test])
    assert error_of(executed[test]).ename == "AssertionError"  # nbgrader gives the cell 0
    assert len(lines) < MAX_LINES, "\n".join(lines)
    assert not [line for line in lines if any(word in line for word in INTERNALS)], lines


@pytest.mark.slow
def test_a_stub_kernel_says_not_started_and_points_at_its_line(executed):
    lines = shown(executed["test_stub_saxpy"])
    assert lines[0] == "AssertionError: saxpy is not started: it raised NotImplementedError."
    assert lines[1] == "Replace `raise NotImplementedError()` with your kernel's code."
    assert re.fullmatch(r"Cell In\[\d+\], line 5, in saxpy", lines[2]), lines
    assert lines[3].endswith("raise NotImplementedError()")


@pytest.mark.slow
def test_a_wrong_kernel_shows_the_hint_first(executed):
    lines = shown(executed["test_swapped_saxpy"])
    assert lines[0].startswith("AssertionError: out[i] is a * y[i] + x[i]: x and y are swapped.")
    assert "out[0] is" in lines[0] and "expected" in lines[0]
    assert lines[-1] == "(%tb shows the full traceback)"


@pytest.mark.slow
def test_a_stub_function_of_lab_2_says_not_started(executed):
    lines = shown(executed["test_stub_to_device"])
    assert lines[:2] == ["AssertionError: to_device is not started: it raised NotImplementedError.",
                         "Replace `raise NotImplementedError()` with your code."]
    assert re.fullmatch(r"Cell In\[\d+\], line 4, in to_device", lines[2]), lines


@pytest.mark.slow
def test_percent_tb_still_shows_the_whole_traceback(executed):
    text = "\n".join(shown(executed["full_traceback"]))
    assert "Traceback" in text and "gpulab/checks/lab1/saxpy.py" in text


@pytest.mark.slow
def test_an_error_outside_the_checkers_shows_as_ipython_shows_it(executed):
    error = error_of(executed["own_assert"])
    assert error.ename == "AssertionError" and error.evalue == "my own check"
    assert any("assert 1 + 1 == 3" in line for line in shown(executed["own_assert"]))
    assert not any("%tb" in line for line in shown(executed["own_assert"]))


@pytest.mark.slow
def test_the_feedback_page_quotes_the_same_short_message(executed):
    nb = new_notebook(cells=[copy.deepcopy(executed[t]) for t in TESTS])
    ScrubTestCells().preprocess(nb, {})
    stub, swapped, to_device = (cell.outputs[0].traceback for cell in nb.cells)
    assert stub == ["AssertionError: saxpy is not started: it raised NotImplementedError.\n"
                    "Replace `raise NotImplementedError()` with your kernel's code."]
    assert swapped[0].startswith("AssertionError: out[i] is a * y[i] + x[i]: x and y are swapped")
    assert to_device[0].startswith("AssertionError: to_device is not started")


# ----------------------------------------------------------------------------- in this process


def stub(batch, device):
    raise NotImplementedError()


def half_written(batch, device):
    batch = list(batch)
    raise NotImplementedError("the dict case")


def test_only_a_stubs_own_error_counts_as_a_stub():
    for fn, want in ((stub, True), (half_written, False)):
        with pytest.raises(NotImplementedError) as caught:
            fn([], "cpu")
        assert is_stub_error(caught.value) is want, fn.__name__
    assert not is_stub_error(ValueError())


def test_the_learners_line_is_found_below_the_checker():
    from gpulab.checks.lab2 import check_to_device

    with pytest.raises(AssertionError) as caught:
        check_to_device(stub)
    filename, lineno, function = learner_line(caught.value)
    assert (filename, function) == (__file__, "stub")
    assert is_learners(__file__) and not is_learners(pytest.__file__)
    assert not is_learners(os.path.join(os.path.dirname(gpulab.__file__), "stubs.py"))
    lines = "\n".join(short_traceback(caught.value, color=False)).splitlines()
    assert lines[0].startswith("AssertionError: to_device is not started")
    assert lines[2] == f"File {__file__}:{lineno}, in stub"


def test_outside_ipython_nothing_is_installed():
    assert install_in_ipython() is False


class FakeShell:
    """The two things install_in_ipython asks of IPython's shell."""

    def __init__(self, custom_exceptions=()):
        self.custom_exceptions = custom_exceptions
        self.installed = []

    def set_custom_exc(self, exc_tuple, handler):
        self.custom_exceptions = exc_tuple
        self.installed.append(handler)


def test_installs_once_and_leaves_another_handler_alone(monkeypatch):
    import IPython

    shell = FakeShell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert install_in_ipython() and install_in_ipython()  # a second import changes nothing
    assert shell.custom_exceptions == (AssertionError, NotImplementedError)
    assert len(shell.installed) == 1  # the integrity guard's snapshot stays as it was taken
    theirs = FakeShell((ValueError,))
    monkeypatch.setattr(IPython, "get_ipython", lambda: theirs)
    assert not install_in_ipython() and theirs.custom_exceptions == (ValueError,)
