"""Class-scale grading cost (autograder/cost.py): CPU seconds per submission, measured on the
fixture lab, and the projection to a many-core runner. One grading, about 10 s on 2 cores."""

import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autograder.cost import CpuMeter, GradingCost, measure, projected_wall_s
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


def test_the_cgroup_meter_counts_a_process_nobody_waits_for(tmp_path):
    """An orphan (a rank a kill ended, a sandboxed kernel) never reaches getrusage; the cgroup
    counts it."""
    meter = CpuMeter()
    if meter.accounting != "cgroup":
        meter.stop()
        pytest.skip("no cpuacct cgroup can be made here (not root, or no cgroup v1)")
    done = tmp_path / "done"
    busy = ("import pathlib, sys, time\nt = time.process_time()\n"
            "while time.process_time() - t < 1: pass\npathlib.Path(sys.argv[1]).touch()")
    orphan = f'{sys.executable} -c "$0" {done} &'  # bash exits at once: nobody waits for it
    subprocess.run(["bash", "-c", orphan, busy], check=True)
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists(), "the orphan did not finish"
    assert meter.stop() >= 0.9
