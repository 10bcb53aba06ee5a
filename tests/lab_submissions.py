"""Submissions made from a lab's own notebooks, for grading labs end to end.

    lab = Lab("lab1_cuda_kernels")
    lab.solution()                       the source notebook, answers and hidden tests included
    lab.released()                       labs/<lab> as a learner receives it
    lab.with_mistake(mistake)            the solution with one part broken the way learners do
    lab.hand_in(folder, "ada", nb)       folder/ada/<lab>.ipynb, as a learner hands it in
    run_in_process(nb, "test_saxpy")     what that test cell raises when nb's cells run here
    fails(check, kernel, "teaching")     the checker rejects a known-wrong kernel, teaching so

Each mistake is a string replacement in one answer cell, found by its nbgrader grade_id. The
replaced text must occur exactly once: when the lab's solution changes, building the submission
fails here, loudly, instead of grading an unchanged (correct) notebook and testing nothing.
Not a test module (no `test_` prefix): the grading tests, the checkers' tests and benchmarks
import it.
"""

from __future__ import annotations

import html
import linecache
import re
import types
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

ROOT = Path(__file__).resolve().parents[1]
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


@dataclass(frozen=True)
class Mistake:
    """One known-wrong answer: which cell changes, how, and what the grader must say."""

    student_id: str  # the learner who hands it in
    cell: str  # grade_id of the answer cell that changes
    old: str  # text of the solution, found exactly once in that cell
    new: str  # what the learner wrote instead
    test: str  # grade_id of the test cell that must fail, with the teaching message
    teaching: str  # regex: the checker's message about it, which the feedback must show
    also_fails: tuple[str, ...] = ()  # other test cells that run the same code, and fail too


def read(path: Path) -> NotebookNode:
    return nbformat.read(path, as_version=4)


def grade_id(cell: NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def cell_by_grade_id(nb: NotebookNode, wanted: str) -> NotebookNode:
    """The one cell of `nb` whose nbgrader grade_id is `wanted`."""
    found = [cell for cell in nb.cells if grade_id(cell) == wanted]
    if len(found) != 1:
        raise LookupError(f"{len(found)} cells with grade_id {wanted!r} in the notebook")
    return found[0]


def run_in_process(nb: NotebookNode, test: str, context: tuple[str, ...] = ()):
    """Run `nb` here as a grading kernel would run it up to its test cell `test`, and return
    what that cell raised (None if it passed): the setup and answer cells before it, the
    ungraded cells whose ids are in `context` (those that define what the answers use), then
    the test cell whole, hidden tests included. One module named __main__ holds them, so that
    code sent to ranks travels by value as a notebook's does, and each cell's text stays in
    linecache, as IPython keeps it, for checkers that read the learner's source."""
    from IPython.core.inputtransformer2 import TransformerManager  # the Colab cell's %pip

    module = types.ModuleType("__main__")
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        name = grade_id(cell) or cell.get("id", str(index))
        is_test = bool(meta.get("grade")) and cell.cell_type == "code"
        if cell.cell_type != "code" or (is_test and name != test):
            continue
        if not (meta or name in context or name == test):
            continue  # a worked example or a "Try it" cell: the answers do not need it
        source = TransformerManager().transform_cell(cell.source)
        filename = f"/tmp/ipykernel_0/{name}.py"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        code = compile(source, filename, "exec")
        if name != test:
            exec(code, module.__dict__)
            continue
        try:
            exec(code, module.__dict__)
        except AssertionError as error:
            return error
        return None
    raise LookupError(f"no test cell {test!r} in the notebook")


def points_of(nb: NotebookNode) -> dict[str, float]:
    """grade_id -> points of every autograded test cell of `nb`."""
    return {
        grade_id(c): float(c.metadata["nbgrader"]["points"])
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"
    }


def error_of(cell: NotebookNode):
    """The one error output of a graded cell."""
    (error,) = [out for out in cell.outputs if out.output_type == "error"]
    return error


def page_text(page: str) -> str:
    """An HTML page as a reader sees it: tags gone, entities decoded, so that a hidden line
    split into syntax-highlighting spans is still found whole."""
    without_code = re.sub(r"(?is)<(script|style)\b.*?</\1>", "", page)
    return html.unescape(re.sub(r"<[^>]+>", "", without_code))


@dataclass(frozen=True)
class Lab:
    """One lab's notebooks in this repository."""

    name: str  # e.g. "lab1_cuda_kernels"

    @property
    def notebook(self) -> str:
        return f"{self.name}.ipynb"

    @property
    def solution_path(self) -> Path:
        return ROOT / "solutions" / self.name / self.notebook

    @property
    def release_path(self) -> Path:
        return ROOT / "labs" / self.name / self.notebook

    def solution(self) -> NotebookNode:
        return read(self.solution_path)

    def released(self) -> NotebookNode:
        return read(self.release_path)

    def check_points(self, points: dict[str, float], full_marks: float) -> None:
        """The test cells of the solution and of the release carry `points`, which sum to
        `full_marks`, and the introduction's table of parts gives them in the same order."""
        assert points_of(self.solution()) == points
        stale = "labs/ is out of step: run `autograder release`"
        assert points_of(self.released()) == points, stale
        assert sum(points.values()) == full_marks
        table = re.findall(r"^\| \d \| .* \| (\d+) \|$", self.solution().cells[0].source, re.M)
        assert [int(p) for p in table] == list(points.values()), "the introduction's table"

    def with_mistake(self, mistake: Mistake, nb: NotebookNode | None = None) -> NotebookNode:
        """The solution (or `nb`) with `mistake` made in its answer cell."""
        nb = nb if nb is not None else self.solution()
        cell = cell_by_grade_id(nb, mistake.cell)
        if not cell.metadata["nbgrader"].get("solution"):
            raise LookupError(f"cell {mistake.cell!r} is not an answer cell")
        count = cell.source.count(mistake.old)
        if count != 1:
            raise LookupError(
                f"{mistake.old!r} occurs {count} times in cell {mistake.cell!r}, not once: the "
                "lab's solution changed; update this mistake to match it.")
        cell.source = cell.source.replace(mistake.old, mistake.new)
        return nb

    def cells_changed_by(self, mistake: Mistake) -> list[int]:
        """Indexes of the solution's cells that `mistake` changes (one, for a well-made mistake)."""
        right = [c.source for c in self.solution().cells]
        wrong = [c.source for c in self.with_mistake(mistake).cells]
        return [i for i, (a, b) in enumerate(zip(right, wrong, strict=True)) if a != b]

    def hand_in(self, folder: Path, student_id: str, nb: NotebookNode) -> Path:
        """Write `nb` as `student_id`'s submission: folder/<student_id>/<lab>.ipynb."""
        path = Path(folder) / student_id / self.notebook
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        return path

    def hidden_test_lines(self, nb: NotebookNode | None = None) -> list[str]:
        """The stripped, non-empty lines between the hidden-test delimiters of the solution."""
        nb = nb if nb is not None else self.solution()
        lines = []
        for cell in nb.cells:
            inside = False
            for line in cell.source.splitlines():
                if BEGIN_HIDDEN in line:
                    inside = True
                elif END_HIDDEN in line:
                    inside = False
                elif inside and line.strip():
                    lines.append(line.strip())
        return lines


def fails(check, kernel, match: str) -> str:
    """check(kernel) raises an AssertionError whose message matches `match`; the message."""
    import pytest

    with pytest.raises(AssertionError) as error:
        check(kernel)
    assert re.search(match, str(error.value), re.S), str(error.value)
    return str(error.value)
