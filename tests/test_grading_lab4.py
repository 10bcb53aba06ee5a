"""Lab 4, memory and profiling, graded end to end: the checks of
tests/grading_checks.py on its batch."""

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_specs import LAB4

SPEC = LAB4
pytestmark = list(SPEC.marks)
