"""Expected answers, computed where the learner's code cannot reach them.

A numeric answer's expected value comes from the library (a GPU's spec sheet, a memory recipe,
a cost model), and the learner's kernel can change the library's data in place: a frozen
dataclass yields to object.__setattr__, a table to item assignment. So a hidden test never
computes its expected value in that kernel. It names it, `answer_key("lab1.waves")`, and the
grader replaces that call with the value itself (a literal) before the cell is sent to the
kernel. The grader computes the values in a process of their own, started from the installed
library before the submission runs, for the students of the batch:

    python -m gpulab.checks.keys lab1_cuda_kernels                   # {"lab1.waves": {...}}
    python -m gpulab.checks.keys quiz --student ada --student bob    # {"ada": {...}, "bob": {...}}

Some answers differ per learner (the quiz's numbers, gpulab/quiz/variant.py): a test cell
names the learner too, `answer_key("quiz.q02", mine.learner)`, and the grader replaces the
whole call with the value for the student who handed the notebook in, whatever the notebook
says. Outside grading (a learner running the tests, CI running the solution) `answer_key`
computes the value in place, which is right there: nothing is at stake in the learner's own
kernel.
Each assignment's package lists its answers in ANSWERS: name -> a function returning plain
numbers, strings, lists and dicts (what JSON carries and Python writes as a literal), of no
arguments, or of one, the learner's id, for an answer that differs per learner.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

from gpulab.checks import PACKAGES, find_lab, package

CALL_NAME = "answer_key"  # the grader looks for calls of this name in test cells


def per_learner(compute) -> bool:
    """True for an ANSWERS function that takes the learner's id: its value differs per learner."""
    return bool(inspect.signature(compute).parameters)


def answer_key(name: str, learner: str | None = None):
    """The expected answer `name` ("lab1.waves", "quiz.q02"), computed from the library; for an
    answer that differs per learner, `learner`'s."""
    short, _, key = name.partition(".")
    answers = package(short).ANSWERS
    if key not in answers:
        raise KeyError(f"{short} has no answer {key!r}: it has {', '.join(answers) or 'none'}")
    return _value(name, answers[key], learner)


def all_answers(lab: str, learner: str | None = None) -> dict:
    """Every expected answer of `lab`, by its full name ("lab1.waves"); `learner`'s, for those
    that differ per learner."""
    short = find_lab(lab).split("_", 1)[0]
    return {f"{short}.{key}": _value(f"{short}.{key}", compute, learner)
            for key, compute in package(lab).ANSWERS.items()}


def answers_by_student(lab: str, students: list[str]) -> dict:
    """{student: every expected answer of `lab` for them}. An answer the same for everyone is
    computed once (Lab 4's measures a training step)."""
    short = find_lab(lab).split("_", 1)[0]
    answers = package(lab).ANSWERS
    shared = {f"{short}.{key}": compute() for key, compute in answers.items()
              if not per_learner(compute)}
    return {student: {**shared, **{f"{short}.{key}": compute(student)
                                   for key, compute in answers.items() if per_learner(compute)}}
            for student in students}


def _value(name: str, compute, learner: str | None):
    if not per_learner(compute):
        return compute()
    if learner is None:
        raise ValueError(f"{name} differs per learner: say whose")
    return compute(learner)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpulab.checks.keys",
        description="A lab's expected answers as JSON: {name: value}, or with --student, "
                    "{student: {name: value}}.")
    parser.add_argument("lab", choices=list(PACKAGES))
    parser.add_argument("--student", action="append", default=[],
                        help="a learner to compute the answers for (repeat for several)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # argparse's usage message is already on stderr
        return int(stop.code or 0)
    try:
        found = (answers_by_student(args.lab, args.student) if args.student
                 else all_answers(args.lab))
    except ValueError as error:  # an answer that differs per learner, and no --student
        print(f"python -m gpulab.checks.keys: {error} (--student ID)", file=sys.stderr)
        return 2
    json.dump(found, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
