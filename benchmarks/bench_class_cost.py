"""What grading a class costs, per lab: CPU seconds per submission, measured here, and the wall
time of a class of 300 on a runner of 16 cores, projected from them (autograder/cost.py).

    full    every graded notebook in solutions/ (Labs 1 to 5, the capstone, the quiz): its
            solution handed in by 2 learners, graded at --jobs 1, then again at --jobs 2, each
            into a fresh grading root
    quick   the fixture lab (tests/fixtures), one submission, at --jobs 1 and 2: a smoke test

    GPULAB_BENCH_LABS=lab2_amp_training,quiz   only those notebooks (the full run grades
                                               each solution four times: a long run)

    <lab>: CPU per submission              user + system seconds of the grading and every
                                           process it waited for (worker, grading kernel, the
                                           ranks it started), per submission, at --jobs 1; the
                                           note gives --jobs 2's too. Target on the cpu runner,
                                           for Lab 3 and Lab 5: under 180 s, the budget of
                                           grading one submission of either
    <lab>: 300 submissions, 16 cores       rounds of 16 submissions at --jobs 16, each as long
                                           as one submission's CPU time at --jobs 2 (the run
                                           where submissions shared the cores). A projection,
                                           not a measurement: memory bandwidth and the disk,
                                           shared by the 16 jobs, are not modelled

CPU time, unlike a wall time, hardly depends on what else runs on the machine. The solutions
are graded without the sandbox (`grade --no-sandbox`): a sandboxed kernel's CPU time does not
reach the grader's accounting, and bubblewrap's start is all the sandbox adds. The solution
must score full marks in both runs, or its CPU row is marked missed: a grading that stopped
early costs less and says nothing. On the gpu runner the figures are reported without targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from common import Row

ROOT = Path(__file__).resolve().parents[1]
LEARNERS = ("learner00", "learner01")
BUDGET_S = 180.0  # grading one submission, on the cpu runner
BUDGETED = ("lab3_ddp_from_scratch", "lab5_parallelism_across_nodes")
CLASS, CORES = 300, 16
FIXTURE = "lab0_fixture"


def _labs() -> list[str]:
    """The notebooks to grade: GPULAB_BENCH_LABS's, or every one in solutions/."""
    chosen = [name for name in os.environ.get("GPULAB_BENCH_LABS", "").split(",") if name]
    every = sorted(path.name for path in (ROOT / "solutions").iterdir() if path.is_dir())
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        raise ValueError(f"GPULAB_BENCH_LABS names no lab in solutions/: {', '.join(unknown)}")
    return chosen or every


def _hand_in_solution(lab: str, submissions: Path, learners: tuple[str, ...]) -> Path:
    """`lab`'s solution as each learner's submission; returns the course root it belongs to."""
    sys.path.insert(0, str(ROOT / "tests"))
    from lab_submissions import Lab

    notebooks = Lab(lab)
    for learner in learners:
        notebooks.hand_in(submissions, learner, notebooks.solution())
    return ROOT


def _hand_in_fixture(submissions: Path, scratch: Path) -> Path:
    """The fixture lab's solution as one learner's submission, in a course root of its own."""
    shutil.copytree(ROOT / "tests" / "fixtures" / "solutions", scratch / "solutions")
    notebook = f"{FIXTURE}.ipynb"
    (submissions / LEARNERS[0]).mkdir(parents=True)
    shutil.copyfile(scratch / "solutions" / FIXTURE / notebook,
                    submissions / LEARNERS[0] / notebook)
    return scratch


def _measure_both(root: Path, lab: str, submissions: Path, scratch: Path, profile):
    """The grading cost at --jobs 1 and at --jobs 2, each into a fresh grading root."""
    from autograder.cost import measure
    from autograder.course import Course
    from autograder.grade import prepare_lab

    # A `grade` command imports nbgrader's machinery once, seconds of CPU that are no
    # submission's: generating the lab into a throwaway root first leaves them out of both runs.
    with contextlib.redirect_stdout(io.StringIO()):
        prepare_lab(Course.at(root, scratch / "warm-up"), lab)
    costs = []
    for jobs in (1, 2):
        course = Course.at(root, scratch / f"jobs-{jobs}")
        with contextlib.redirect_stdout(io.StringIO()):  # a line per learner: not for the table
            costs.append(measure(course, lab, submissions, profile, jobs=jobs))
    return costs


def _rows(lab: str, serial, parallel, runner: str) -> list[Row]:
    from autograder.cost import projected_wall_s

    full = all(score == most for cost in (serial, parallel) for score, most in cost.scores)
    measured = f"{serial.submissions} measured submission" + "s" * (serial.submissions != 1)
    note = (f"{measured} of the solution, {runner} runner, CPU from {serial.accounting}; jobs 1: "
            f"{serial.cpu_s_per_submission:.1f} s, jobs 2: {parallel.cpu_s_per_submission:.1f} s"
            + ("" if full else "; THE SOLUTION LOST POINTS"))
    budgeted = runner == "cpu" and lab in BUDGETED
    cpu = serial.cpu_s_per_submission
    projected = projected_wall_s(parallel, submissions=CLASS, cores=CORES)
    return [
        Row("class_cost", f"{lab}: CPU per submission", cpu, "s",
            target=f"< {BUDGET_S:g} s" if budgeted else "",
            ok=(full and cpu < BUDGET_S) if budgeted else (None if full else False), note=note),
        Row("class_cost", f"{lab}: {CLASS} submissions, {CORES} cores, --jobs {CORES}",
            projected / 60, "min",
            note=f"projected from {measured}; memory bandwidth and disk not modelled"),
    ]


def run(quick: bool) -> list[Row]:
    import gpulab
    from autograder.profiles import get_profile

    runner = gpulab.runner.name
    # Unsandboxed: where no cgroup counts it, a sandboxed kernel's CPU time is lost to getrusage
    # (autograder/cost.py), and the repository's own solutions are code to trust.
    profile = dataclasses.replace(get_profile(runner), sandboxed=False)
    rows = []
    for lab in [FIXTURE] if quick else _labs():
        with tempfile.TemporaryDirectory(prefix="bench-class-cost-") as tmp:
            scratch = Path(tmp)
            submissions = scratch / "subs"
            submissions.mkdir()
            root = (_hand_in_fixture(submissions, scratch) if quick
                    else _hand_in_solution(lab, submissions, LEARNERS))
            serial, parallel = _measure_both(root, lab, submissions, scratch, profile)
        rows += _rows(lab, serial, parallel, runner)
    return rows
