"""The committed student versions are exactly what `release` makes from the lab sources.

labs/ is generated: a lab is edited in solutions/ only, then released with
`python -m autograder release LAB`, and both are committed together. Every folder of
solutions/ is a graded notebook set: the labs, the quiz and the capstone. Runs nbgrader's
generate_assignment (no kernel), a few seconds per lab.
"""

import pytest

from autograder.course import Course, repository_root
from autograder.release import check_release

COURSE = Course.at(repository_root())
SOURCES = sorted(p.name for p in COURSE.solutions.iterdir() if p.is_dir())
RELEASES = sorted(p.name for p in COURSE.labs.iterdir() if p.is_dir())


@pytest.mark.parametrize("lab", SOURCES)
def test_labs_folder_matches_a_fresh_release(lab):
    drift = check_release(COURSE, lab)
    assert drift.ok, drift.summary()


def test_every_released_lab_has_a_source():
    orphans = sorted(set(RELEASES) - set(SOURCES))
    assert not orphans, (
        f"labs/{orphans[0]} has no solutions/{orphans[0]}: a student version must be generated "
        "from a lab source; remove it or restore its source."
    )
