"""The course quiz (solutions/quiz/quiz.ipynb): its 25 questions and points, the checks their test
cells call (answers.py), the expected numbers of the numeric questions (expected.py), which
differ per learner (gpulab/quiz/variant.py): the grader computes them outside the learner's
kernel, for the id the notebook was handed in under (keys.py), and the known wrong numbers
whose mistakes a message names (slips.py). The quiz is an assessment: it gives no hints.
Taught in: every lesson; each question's hidden test names the section that explains it.
"""

import gpulab.checks.harness  # noqa: F401 - its failures show in the short form too
from gpulab.checks.quiz.answers import check_number, check_pick, grade_number, grade_pick
from gpulab.checks.quiz.expected import ANSWERS
from gpulab.checks.quiz.slips import known_slips
from gpulab.checks.table import Assignment, Part

# Multiple-choice questions (1 point each); the others ask for a number (2 points each).
CHOICE = ("q01", "q05", "q06", "q07", "q08", "q09", "q10", "q11", "q12", "q16", "q17", "q18",
          "q20", "q21", "q23", "q24", "q25")
ASSIGNMENT = Assignment("quiz", tuple(
    Part(f"q{i:02d}", 1 if f"q{i:02d}" in CHOICE else 2, grade_id_prefix="")
    for i in range(1, 26)))

__all__ = ["ANSWERS", "ASSIGNMENT", "CHOICE", "check_number", "check_pick", "grade_number",
           "grade_pick", "known_slips"]
