"""A bank of hostile and broken submissions, each with the outcome grading must reach.

    cases.py   the bank: a small snippet per case (the cell a learner adds, an answer they
               write, an edit of the notebook, or the raw bytes they hand in) and its outcome
    build.py   applies a case to a lab's notebook and hands it in; checks an outcome

The fixture lab (tests/fixtures/solutions/lab0_fixture) takes most cases, Labs 1-4 a few. Graded by
tests/test_autograder_integrity.py and tests/test_autograder_robustness.py, in a few batches.
"""

from hostile.build import check_outcome, hand_in_all
from hostile.cases import (
    CAPSTONE,
    FIXTURE_HIDDEN,
    INTEGRITY,
    LAB1,
    LAB2,
    LAB3,
    LAB4,
    ROBUSTNESS,
    Case,
)

__all__ = [
    "CAPSTONE",
    "FIXTURE_HIDDEN",
    "INTEGRITY",
    "LAB1",
    "LAB2",
    "LAB3",
    "LAB4",
    "ROBUSTNESS",
    "Case",
    "check_outcome",
    "hand_in_all",
]
