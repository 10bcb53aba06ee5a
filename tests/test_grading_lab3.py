"""Lab 3, DDP from the ground up, graded end to end: the checks of tests/grading_checks.py on
its batch, and what only its rings can do: leave processes behind, or never return."""

import re

from grading_checks import *  # noqa: F403  the checks every graded notebook passes
from grading_checks import GRADES
from grading_specs import LAB3
from lab_submissions import error_of

SPEC = LAB3
pytestmark = list(SPEC.marks)


@GRADES
def test_no_process_a_ring_started_outlives_grading(spec, graded):
    batch = graded(spec)
    error = error_of(batch.tests["lab3_orphans"]["test_ring_all_reduce"])
    assert "the tensor passed in is unchanged" in error.evalue, "the ring did not get to return"
    assert not batch.run.left_behind, f"left behind: {batch.run.left_behind[:3]}"


@GRADES
def test_a_ring_that_never_returns_is_stopped_and_explained(spec, graded):
    error = error_of(graded(spec).tests["lab3_stubborn"]["test_ring_all_reduce"])
    assert re.search(r"did not finish within 20 s, and every rank was stopped", error.evalue)
