"""Whose notebook it is: the student who handed it in, to the grading kernel and in the notebook.

Some notebooks are written for one learner: the quiz draws each learner's numbers from their
id (gpulab/quiz/variant.py). The learner names themselves at the top, `LEARNER = "ada"`, or
leaves it empty on JupyterHub, whose JUPYTERHUB_USER says who they are. Grading holds both to
the student who handed the notebook in:

    kernel_environment(environ, student)   the grading kernel's variables: JUPYTERHUB_USER is
                                           the student's, as in their own hub session, never
                                           the grader's own
    other_learner(nb, student)             the id a `LEARNER = "..."` line names when it is not
                                           the student's: the notebook was written for another
                                           learner (a classmate's, handed in as it is)

Such a notebook is not run: each of its tests scores zero, and the submission is flagged
"learner mismatch" (autograder/execute.py). Only a plain string counts as naming a learner; an
expression is left to the notebook's own check, which refuses a LEARNER that is not the hub's
user. Either way the expected answers are the student's (autograder/answers.py), so answers
copied from another learner's notebook miss their numbers even with the LEARNER line changed.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from autograder.cells import parse_cell

LEARNER_NAME = "LEARNER"  # the variable a notebook names its learner with
HUB_USER = "JUPYTERHUB_USER"  # JupyterHub's name for the user a server runs for


def kernel_environment(environ: Mapping[str, str], student: str | None) -> dict[str, str]:
    """`environ` with JUPYTERHUB_USER set to `student` (removed when there is none)."""
    env = {name: value for name, value in environ.items() if name != HUB_USER}
    if student:
        env[HUB_USER] = student
    return env


def named_learners(nb) -> list[tuple[int, str]]:
    """(cell index, id) for each top-level `LEARNER = "<id>"` of the notebook's code cells, in
    order; an empty id names nobody (the hub's user is used)."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or LEARNER_NAME not in cell.source:
            continue
        for node in parse_cell(cell.source).body:
            value = _assigned_to_learner(node)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                if value.value.strip():
                    found.append((index, value.value.strip()))
    return found


def other_learner(nb, student: str) -> tuple[int, str] | None:
    """(cell index, id) of the first learner the notebook names who is not `student`, or None."""
    return next(((index, name) for index, name in named_learners(nb) if name != student), None)


def _assigned_to_learner(node) -> ast.expr | None:
    if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == LEARNER_NAME for t in node.targets):
        return node.value
    if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and node.target.id == LEARNER_NAME):
        return node.value
    return None

