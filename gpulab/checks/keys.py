"""Expected answers, computed where the learner's code cannot reach them.

A numeric answer's expected value comes from the library (a GPU's spec sheet, a memory recipe,
a cost model), and the learner's kernel can change the library's data in place: a frozen
dataclass yields to object.__setattr__, a table to item assignment. So a hidden test never
computes its expected value in that kernel. It names it, `answer_key("lab1.waves")`, and the
grader replaces that call with the value itself (a literal) before the cell is sent to the
kernel. The grader computes the values in a process of their own, started from the installed
library before the submission runs:

    python -m gpulab.checks.keys lab1_cuda_kernels      # {"lab1.waves": {...}} as JSON

Outside grading (a learner running the tests, CI running the solution) `answer_key` computes the
value in place, which is right there: nothing is at stake in the learner's own kernel.
Each assignment's package lists its answers in ANSWERS (name -> a function of no arguments
returning plain numbers, strings, lists and dicts: what JSON carries and Python writes as a
literal).
"""

from __future__ import annotations

import json
import sys

from gpulab.checks import PACKAGES, find_lab, package

CALL_NAME = "answer_key"  # the grader looks for calls of this name in test cells


def answer_key(name: str):
    """The expected answer `name` ("lab1.waves", "quiz.q02"), computed from the library."""
    short, _, key = name.partition(".")
    answers = package(short).ANSWERS
    if key not in answers:
        raise KeyError(f"{short} has no answer {key!r}: it has {', '.join(answers) or 'none'}")
    return answers[key]()


def all_answers(lab: str) -> dict:
    """Every expected answer of `lab`, by its full name ("lab1.waves")."""
    short = find_lab(lab).split("_", 1)[0]
    return {f"{short}.{key}": compute() for key, compute in package(lab).ANSWERS.items()}


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in PACKAGES:
        print(f"usage: python -m gpulab.checks.keys {{{','.join(PACKAGES)}}}", file=sys.stderr)
        return 2
    json.dump(all_answers(args[0]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
