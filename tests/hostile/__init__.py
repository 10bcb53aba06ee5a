"""A bank of hostile and broken submissions, each with the outcome grading must reach.

    cases.py   the bank: a small snippet per case (the cell a learner adds, an answer they
               write, an edit of the notebook, or the raw bytes they hand in) and its outcome
    build.py   applies a case to a lab's notebook and hands it in; checks an outcome

    cases_for(lab)  every case that hands in `lab`, from whichever list of the bank holds it

The fixture lab (tests/fixtures/solutions/lab0_fixture) takes most cases, the course's graded
notebooks a few. The fixture's are graded by tests/test_autograder_integrity.py and
tests/test_autograder_robustness.py; each graded notebook's by its
tests/test_grading_<notebook>.py, in that notebook's batch (cases_for), so a case added to any
list is graded there without more code.
"""

from hostile import cases as _bank
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


def cases_for(lab: str) -> list[Case]:
    """Every case of the bank that hands in `lab`, from all its lists (CAPSTONE, LAB4, LAB4_DATA
    and any added later), in the bank's order."""
    found: dict[str, Case] = {}
    for value in vars(_bank).values():
        if not (isinstance(value, list) and value and all(isinstance(c, Case) for c in value)):
            continue
        for case in value:
            if case.lab != lab:
                continue
            if found.setdefault(case.student_id, case) is not case:
                raise ValueError(f"two cases of {lab} hand in as {case.student_id!r}")
    return list(found.values())


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
    "cases_for",
    "check_outcome",
    "hand_in_all",
]
