"""Lab 1, CUDA kernels, graded end to end: the checks of tests/grading_checks.py on its batch."""

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_specs import LAB1

SPEC = LAB1
pytestmark = list(SPEC.marks)
