"""Expected answers fixed outside the learner's kernel, and written into the test cells.

A hidden test that computed its expected value in the grading kernel would compare the learner's
answer with whatever that kernel's library says, and the learner's cells run in that kernel
first: an edit of a GPU's spec sheet (object.__setattr__ on a frozen dataclass) makes both sides
agree on a wrong number. So the course's test cells name an expected value instead,
`answer_key("lab1.waves")`, and grading fixes it before the learner's code runs:

    answers = compute_answers(lab, source, env, students)   # once per batch, in a process of
                                                  # its own, from the installed library
    fill_in(test_cell_source, answers[student])   # each call replaced by its literal value

Answers may differ per learner (the quiz's numbers are drawn from the learner's id): the values
are computed for each student of the batch, and a submission's test cells get those of the
student who handed it in. A call that also names a learner, `answer_key("quiz.q02",
mine.learner)`, is replaced whole: what the notebook says about whose it is plays no part.
fill_in runs in the grader (autograder/execute.py) on a test cell's source just before it is
sent to the kernel; the notebook keeps the cell as written. A name with no computed value
becomes an expression that raises, so such a test fails instead of passing on the kernel's own
number. The grader knows the course only by the command below, never by importing it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ANSWER_CALL = "answer_key"  # the name test cells call (gpulab/checks/keys.py)
# + LAB --student ID ...: {student: {name: value}} as JSON on stdout
ANSWERS_COMMAND = (sys.executable, "-m", "gpulab.checks.keys")
# A backstop against a command that hangs, not a budget: it imports torch and numba and
# profiles a few small training steps (Lab 4), tens of CPU-seconds that took over 300 s of
# wall time on 2 cores shared with two other grading runs. grade.py passes its runner's
# time limit for one submission instead.
ANSWERS_TIMEOUT_S = 1800


class AnswersError(RuntimeError):
    """The expected answers of a lab could not be computed: nothing can be graded fairly."""


def uses_answers(source: Path) -> bool:
    """True when a notebook of the lab's source folder names an expected answer."""
    return any(f"{ANSWER_CALL}(" in path.read_text(encoding="utf-8")
               for path in sorted(Path(source).glob("*.ipynb")))


def compute_answers(lab: str, source: Path, env: Mapping[str, str],
                    students: Sequence[str], timeout_s: float = ANSWERS_TIMEOUT_S
                    ) -> dict[str, dict]:
    """{student: {name: value}}: every expected answer of `lab` for each of `students`, computed
    by the course's command in a fresh process with the grading kernel's environment `env` (its
    runner); {} for each when the lab's test cells name none."""
    if not uses_answers(source) or not students:
        return {student: {} for student in students}
    command = [*ANSWERS_COMMAND, lab, *(arg for s in students for arg in ("--student", s))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=dict(env),
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        message = f"computing {lab}'s expected answers took over {timeout_s:g} s"
        raise AnswersError(message) from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise AnswersError(f"computing {lab}'s expected answers failed (exit status "
                           f"{done.returncode}):\n{tail}")
    return json.loads(done.stdout)


def fill_in(source: str, answers: Mapping[str, object]) -> str:
    """`source` with every answer_key("name") call replaced by the literal of its value."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # not plain Python: the kernel will say why when it runs
        return source
    calls = [node for node in ast.walk(tree) if _is_answer_call(node)]
    if not calls:
        return source
    lines = source.splitlines(keepends=True)
    # ast gives byte offsets within a line; edit the UTF-8 bytes, last call first.
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        name = node.args[0].value
        literal = repr(answers[name]) if name in answers else _raises(name)
        first, last = node.lineno - 1, node.end_lineno - 1
        head = lines[first].encode()[:node.col_offset]
        tail = lines[last].encode()[node.end_col_offset:]
        lines[first:last + 1] = [(head + f"({literal})".encode() + tail).decode()]
    return "".join(lines)


def _is_answer_call(node) -> bool:
    """answer_key("name") or answer_key("name", learner): a literal name, no keywords."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == ANSWER_CALL and len(node.args) in (1, 2) and not node.keywords
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _raises(name: str) -> str:
    message = f"the grader has no expected answer {name!r}: ask the instructor"
    return f"(_ for _ in ()).throw(LookupError({message!r}))"
