"""The course quiz's tools in the learner's notebook (its checks: gpulab/checks/quiz/).

    buttons.py   choose("q07", {...}): buttons that say which line to write for a letter
    variant.py   variant(LEARNER): this learner's numbers for the numeric questions
    __main__.py  python -m gpulab.quiz variant STUDENT: a learner's numbers and expected answers

Taught in: the course quiz, solutions/quiz/quiz.ipynb (one question or more per lesson).
"""

from gpulab.quiz.buttons import Pick, Picker, choose
from gpulab.quiz.variant import LearnerError, Variant, draw, learner_id, variant

__all__ = ["LearnerError", "Pick", "Picker", "Variant", "choose", "draw", "learner_id", "variant"]
