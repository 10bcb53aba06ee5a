"""Lab 5, pipeline and tensor parallelism, graded end to end: the checks of
tests/grading_checks.py on its batch."""

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_specs import LAB5

SPEC = LAB5
pytestmark = list(SPEC.marks)
