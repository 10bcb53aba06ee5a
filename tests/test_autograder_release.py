"""`release`: the student version of the fixture lab has no answers, no hidden tests and no
outputs, and `release --check` notices when the committed copy drifts (nbgrader runs here;
about 3 s per release)."""

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_output

from autograder.cli import main
from autograder.course import Course
from autograder.release import check_release, release

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
SOLUTION_CODE = ("return sum(xs) / len(xs)", "best = max(best, x)")
HIDDEN_CODE = ("[[5.0], [-1.0, 1.0, 4.0, 8.0]]", "secret-marker-7f3a", "[-3, -5, -1]")


def source_with_outputs(root: Path) -> Path:
    """The fixture lab copied under `root`, run as an author would leave it: with outputs."""
    shutil.copytree(FIXTURE, root / "solutions")
    path = root / "solutions" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        cell.execution_count = count
        cell.outputs = [new_output("stream", name="stdout", text=f"author output {count}\n")]
        cell.metadata["execution"] = {"iopub.status.idle": "2025-01-01T00:00:00Z"}
    nbformat.write(nb, path)
    return root


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A course root whose labs/ holds a fresh release of the fixture lab."""
    root = source_with_outputs(tmp_path_factory.mktemp("course"))
    assert main(["release", LAB, "--root", str(root)]) == 0
    return root


def test_release_has_no_solutions_no_hidden_tests_no_outputs(released):
    path = released / "labs" / LAB / f"{LAB}.ipynb"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    text = path.read_text()
    for secret in SOLUTION_CODE + HIDDEN_CODE + ("BEGIN SOLUTION", "HIDDEN TESTS"):
        assert secret not in text, f"{secret!r} leaked into the student version"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert not any("execution" in c.metadata for c in code), "run history left in the release"
    stubs = [c for c in code if c.metadata["nbgrader"].get("solution")]
    assert len(stubs) == 2 and all("raise NotImplementedError" in c.source for c in stubs)
    visible = "\n".join(c.source for c in code if c.metadata["nbgrader"].get("grade"))
    assert "check_mean(mean, [[1.0, 2.0, 3.0]])" in visible, "visible tests stay"
    assert "check_running_max(running_max, [[1, 3, 2, 5]])" in visible


def test_check_passes_on_a_fresh_release(released, capsys):
    assert main(["release", LAB, "--check", "--root", str(released)]) == 0
    assert "matches" in capsys.readouterr().out


def test_check_fails_when_the_committed_copy_drifts(released, tmp_path, capsys):
    root = tmp_path / "course"
    shutil.copytree(released, root)
    path = root / "labs" / LAB / f"{LAB}.ipynb"
    path.write_text(path.read_text().replace("mean of small lists", "mean of lists"))
    (root / "labs" / LAB / "notes.txt").write_text("stray file\n")
    assert main(["release", LAB, "--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"changed  {LAB}.ipynb" in out and "extra    notes.txt" in out
    assert "mean of small lists" in out, "the summary shows the diff"

    written = release(Course.at(root), LAB)  # a release repairs it, stray file included
    assert written == [path]
    assert check_release(Course.at(root), LAB).ok
    assert not (root / "labs" / LAB / "notes.txt").exists()


def test_a_malformed_lab_source_is_refused_with_the_reason(tmp_path, capsys):
    (tmp_path / "solutions" / "lab9_bad").mkdir(parents=True)
    text = (FIXTURE / LAB / f"{LAB}.ipynb").read_text().replace("### END HIDDEN TESTS", "")
    (tmp_path / "solutions" / "lab9_bad" / "lab9_bad.ipynb").write_text(text)
    assert main(["release", "lab9_bad", "--root", str(tmp_path)]) == 2
    assert "No end hidden tests statement found" in capsys.readouterr().err
    assert not (tmp_path / "labs" / "lab9_bad").exists()


def test_an_answer_cell_with_starting_code_is_released_with_it(tmp_path):
    """A debugging lab's answer cell carries the code the learner starts from in its metadata
    (gpulab.starting_code): the release gives that code, once, in place of nbgrader's stub."""
    from nbgrader.utils import compute_checksum

    from autograder.release import give_starting_code

    def answer(grade_id, source, **metadata):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata.update(metadata, nbgrader={"grade_id": grade_id, "solution": True,
                                                 "grade": False, "locked": False})
        return cell

    source, released = tmp_path / "source.ipynb", tmp_path / "released.ipynb"
    given = ["def mean(xs):\n", "    return sum(xs) / (len(xs) - 1)  # planted\n"]
    nbformat.write(nbformat.v4.new_notebook(cells=[
        answer("mean", "def mean(xs):\n    return sum(xs) / len(xs)",
               gpulab={"starting_code": given}),
        answer("running_max", "def running_max(xs):\n    return xs")]), source)
    stub = "# YOUR CODE HERE\nraise NotImplementedError()"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        answer("mean", stub, gpulab={"starting_code": given}), answer("running_max", stub)]),
        released)
    give_starting_code(source, released)
    mean, running_max = nbformat.read(released, as_version=4).cells
    assert mean.source == "".join(given) and "gpulab" not in mean.metadata
    assert mean.metadata.nbgrader["checksum"] == compute_checksum(mean)
    assert running_max.source == stub, "a cell without starting code keeps its stub"
