"""Applying a case of the bank to a lab's notebook, handing it in, and checking its outcome."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

from hostile.cases import Case

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def base_notebook(lab: str, base: str) -> Path:
    """The notebook a case starts from: the lab's solution or its release (the fixture lab's
    solution lives under tests/fixtures, and it has no release)."""
    if lab == "lab0_fixture":
        assert base == "solution", "the fixture lab's cases start from its solution"
        return TESTS / "fixtures" / "solutions" / lab / f"{lab}.ipynb"
    return ROOT / {"solution": "solutions", "release": "labs"}[base] / lab / f"{lab}.ipynb"


def hand_in_all(folder: Path, cases: list[Case]) -> Path:
    """Each case as its learner hands it in: folder/<student_id>/<lab>.ipynb."""
    for case in cases:
        path = Path(folder) / case.student_id / f"{case.lab}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        if case.raw is not None:
            path.write_bytes(case.raw)
        else:
            nbformat.write(build(case), path)
    return Path(folder)


def build(case: Case) -> NotebookNode:
    """The case's notebook: its base with the answers, the added cell and the edit applied."""
    nb = nbformat.read(base_notebook(case.lab, case.base), as_version=4)
    for grade_id, source in case.answers.items():
        cell = _cell(nb, grade_id)
        meta = cell.metadata.get("nbgrader", {})  # an answer cell, or another one left open
        assert meta.get("solution") or not (meta.get("grade") or meta.get("locked")), (
            f"{grade_id} is not the learner's to edit")
        cell.source = source
    if case.code:
        nb.cells.insert(nb.cells.index(_cell(nb, case.after)) + 1,
                        nbformat.v4.new_code_cell(case.code.strip()))
    if case.edit:
        action, grade_id = case.edit
        if action == "forge":  # a test cell of the learner's own making, worth 100 points
            forged = nbformat.v4.new_code_cell('print("all good")')
            forged.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                           "grade_id": grade_id, "points": 100,
                                           "schema_version": 3}
            nb.cells.append(forged)
            return nb
        cell = _cell(nb, grade_id)
        if action == "delete":
            nb.cells.remove(cell)
        elif action == "duplicate":  # a second copy, at the end of the notebook
            twin = copy.deepcopy(cell)
            twin["id"] = f"{cell.get('id', 'cell')}-copy"
            nb.cells.append(twin)
        else:
            raise ValueError(f"no edit {action!r}")
    return nb


def _cell(nb: NotebookNode, wanted: str) -> NotebookNode:
    found = [c for c in nb.cells
             if c.metadata.get("nbgrader", {}).get("grade_id") == wanted or c.get("id") == wanted]
    if len(found) != 1:
        raise LookupError(f"{len(found)} cells named {wanted!r}: the lab changed; update the bank")
    return found[0]


def check_outcome(case: Case, result) -> None:
    """Assert that a GradeResult is what `case` expects, with messages that say what differs."""
    who = f"{case.student_id} ({case.attack})"
    if case.error is not None:
        assert not result.ok, f"{who}: graded, but expected an error with {case.error!r}"
        assert case.error in result.error, f"{who}: error is {result.error!r}"
    else:
        assert result.ok, f"{who}: not graded: {result.error}"
        got = {cell.grade_id: cell.auto_score for cell in result.scores}
        assert got == case.scores, f"{who}: scores {got}, expected {case.scores}"
        assert len(result.scores) == len(case.scores), f"{who}: a test scored twice"
    for wanted in case.flags:
        assert any(wanted in flag for flag in result.flags), (
            f"{who}: no flag with {wanted!r} in {result.flags}")
    if not case.flags:
        assert not result.flags, f"{who}: unexpected flags {result.flags}"
    for cell, wanted in case.reasons:
        assert any(r.cell == cell and wanted in r.reason for r in result.reasons), (
            f"{who}: no reason for {cell} with {wanted!r} in {result.reasons}")
