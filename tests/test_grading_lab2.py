"""Lab 2, debugging a mixed-precision training loop, graded end to end: the checks of
tests/grading_checks.py on its batch."""

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_specs import LAB2

SPEC = LAB2
pytestmark = list(SPEC.marks)
