"""`python -m gpulab.quiz variant STUDENT`: a learner's numbers and expected answers, for the
instructor (a learner asking about a grade, a question to check by hand).

The numbers are drawn from the id alone (gpulab/quiz/variant.py), and the answers are the
grader's own (gpulab/checks/keys.py), computed by this machine's gpulab.
"""

import argparse
import sys


def report(student: str) -> str:
    """Each numeric question's numbers for `student`, and its expected answer."""
    from gpulab.checks.keys import all_answers
    from gpulab.quiz.variant import Variant, draw

    mine, answers = draw(student), all_answers("quiz", student)
    lines = [f"The quiz's numbers and expected answers for learner {mine.learner!r}:"]
    for question in Variant.questions():
        lines += ["", mine.describe(question),
                  f"  expected answer: {answers[f'quiz.{question}']:.6g}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.quiz", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("variant", help="a learner's numbers and expected answers")
    one.add_argument("student", help="the learner's id, as they hand the quiz in under")
    args = parser.parse_args(argv)
    print(report(args.student))
    return 0


if __name__ == "__main__":
    sys.exit(main())
