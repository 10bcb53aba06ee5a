"""Class-scale grading cost (autograder/cost.py): CPU seconds per submission, measured on the
fixture lab, and the projection to a many-core runner. One grading, about 10 s on 2 cores."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from autograder.cost import GradingCost, measure, projected_wall_s
from autograder.course import Course
from autograder.profiles import get_profile
from autograder.release import release

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"


def test_a_projection_runs_the_submissions_in_rounds_of_one_per_core():
    cost = GradingCost(LAB, submissions=4, jobs=2, wall_s=30.0, cpu_s=40.0)  # 10 s each
    assert projected_wall_s(cost, submissions=300, cores=16) == 19 * 10.0  # ceil(300 / 16)
    assert projected_wall_s(cost, submissions=32, cores=16) == 2 * 10.0
    assert cost.wall_s_per_submission == 7.5


@pytest.mark.slow
def test_the_cpu_time_of_a_grading_counts_its_workers_and_kernels(tmp_path):
    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root / "solutions")
    course = Course.at(root)
    release(course, LAB)
    (tmp_path / "subs" / "ada").mkdir(parents=True)
    shutil.copyfile(FIXTURE / LAB / f"{LAB}.ipynb", tmp_path / "subs" / "ada" / f"{LAB}.ipynb")

    # Unsandboxed: a sandboxed kernel's CPU time reaches no one's account (autograder/cost.py).
    cost = measure(course, LAB, tmp_path / "subs", replace(get_profile("cpu"), sandboxed=False))

    assert (cost.lab, cost.submissions, cost.jobs) == (LAB, 1, 1)
    assert cost.scores == ((5.0, 5.0),), cost  # the fixture's solution: full marks
    # A grading kernel alone imports gpulab, numpy and nbgrader's machinery: seconds of CPU,
    # which only an account of the child processes sees.
    assert cost.cpu_s_per_submission > 1.0, cost
    assert cost.wall_s > 0, cost
