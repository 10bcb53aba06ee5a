"""What grading a class costs: CPU seconds per submission, measured, and the wall time a runner
of many cores would need, projected from them.

    cost = measure(course, "lab1_cuda_kernels", Path("submissions"), jobs=2)
    cost.cpu_s_per_submission                      measured on this machine
    projected_wall_s(cost, submissions=300, cores=16)

The CPU time is the grading run's own and every process it waited for (workers, their grading
kernels and the ranks those started), from the kernel's accounting (getrusage), so it does not
depend on how many other programs share the machine the way a wall time does. Except in the
sandbox: bubblewrap's processes are not waited for by their parents, and a kernel taken down by
a kill dies with its pid namespace, so a sandboxed kernel's CPU time reaches nobody's account.
Measure trusted notebooks (a lab's solution) with the profile's `sandboxed=False`, which costs
the same but for bubblewrap's start. A projection assumes what the cpu runner's profile sets up:
one PyTorch thread per grading kernel and `--jobs` equal to the cores, so that the cores stay
busy and each submission costs the same CPU time wherever it runs. It is a projection, not a
measurement: memory bandwidth and the disk, shared by all the jobs, are left out.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path

from autograder.course import Course
from autograder.profiles import RunnerProfile


@dataclass(frozen=True)
class GradingCost:
    """One measured grading run of `submissions` submissions of `lab`, `jobs` at a time."""

    lab: str
    submissions: int
    jobs: int
    wall_s: float
    cpu_s: float  # user + system, this process and every process it waited for
    scores: tuple[tuple[float, float], ...] = ()  # (score, max score) of each submission

    @property
    def cpu_s_per_submission(self) -> float:
        return self.cpu_s / self.submissions

    @property
    def wall_s_per_submission(self) -> float:
        return self.wall_s / self.submissions


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have ended."""
    return sum(usage.ru_utime + usage.ru_stime
               for usage in (resource.getrusage(resource.RUSAGE_SELF),
                             resource.getrusage(resource.RUSAGE_CHILDREN)))


def measure(course: Course, lab: str, submissions: Path | None = None,
            profile: RunnerProfile | None = None, jobs: int = 1) -> GradingCost:
    """Grade every submission of `lab` again (`grade --regrade`) and time it."""
    from autograder.grade import grade

    cpu_before, wall_before = cpu_seconds(), time.perf_counter()
    results = grade(course, lab, submissions, profile, progress=False, jobs=jobs, regrade=True)
    wall_s, cpu_s = time.perf_counter() - wall_before, cpu_seconds() - cpu_before
    failed = [result.student_id for result in results if not result.ok]
    if not results or failed:
        raise RuntimeError(f"grading {lab} to measure it: no grade for "
                           f"{', '.join(failed) or 'any submission (none found)'}")
    return GradingCost(lab, len(results), jobs, wall_s, cpu_s,
                       tuple((result.score, result.max_score) for result in results))


def projected_wall_s(cost: GradingCost, submissions: int = 300, cores: int = 16) -> float:
    """The wall time of `submissions` submissions on `cores` cores at `--jobs` = cores: the
    submissions go out in rounds of `cores`, each round as long as one submission's CPU time."""
    rounds = -(-submissions // cores)  # ceil
    return rounds * cost.cpu_s_per_submission
