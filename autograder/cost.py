"""What grading a class costs: CPU seconds per submission, measured, and the wall time a runner
of many cores would need, projected from them.

    cost = measure(course, "lab1_cuda_kernels", Path("submissions"), jobs=2)
    cost.cpu_s_per_submission                      measured on this machine
    projected_wall_s(cost, submissions=300, cores=16)

The CPU time is the grading run's own and every process it started (workers, their grading
kernels and the ranks those started), from the kernel's accounting, so it does not depend on
how many other programs share the machine the way a wall time does. Where a cpuacct cgroup can
be made (root, cgroup v1), the run goes in one of its own, which counts every process started
in it, ended or not. Elsewhere getrusage counts only the processes their parents waited for:
it misses a sandboxed kernel (bubblewrap does not wait, and a kill takes down its pid namespace)
and the ranks a fork server started when a kill ends them, so measure trusted notebooks (a
lab's solution) with the profile's `sandboxed=False` there; `GradingCost.accounting` says
which was used. A projection assumes what the cpu runner's profile sets up:
one PyTorch thread per grading kernel and `--jobs` equal to the cores, so that the cores stay
busy and each submission costs the same CPU time wherever it runs. It is a projection, not a
measurement: memory bandwidth and the disk, shared by all the jobs, are left out.
"""

from __future__ import annotations

import os
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
    accounting: str = "getrusage"  # or "cgroup": see CpuMeter

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


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, where it is mounted


class CpuMeter:
    """CPU seconds since it was made, of this process and every process started after it: a
    cpuacct cgroup of its own where one can be made, else getrusage (see the module's text)."""

    def __init__(self):
        self.group = self.home = None
        try:
            home = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text()
                        .splitlines() if "cpuacct" in line.split(":")[1].split(","))
            group = CPUACCT / f"gpulab-cost-{os.getpid()}-{time.monotonic_ns()}"
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group, self.home = group, CPUACCT / home.lstrip("/")
        except (OSError, StopIteration, IndexError):
            pass
        self.accounting = "getrusage" if self.group is None else "cgroup"
        self.start = self.read()

    def read(self) -> float:
        if self.group is None:
            return cpu_seconds()
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def stop(self) -> float:
        """The CPU seconds used; this process goes back to its own cgroup."""
        used = self.read() - self.start
        if self.group is not None:
            try:
                (self.home / "cgroup.procs").write_text(str(os.getpid()))
                self.group.rmdir()  # refused while a process of the run lingers: left behind
            except OSError:
                pass
        return used


def measure(course: Course, lab: str, submissions: Path | None = None,
            profile: RunnerProfile | None = None, jobs: int = 1) -> GradingCost:
    """Grade every submission of `lab` again (`grade --regrade`) and time it."""
    from autograder.grade import grade

    meter, wall_before = CpuMeter(), time.perf_counter()
    try:
        results = grade(course, lab, submissions, profile, progress=False, jobs=jobs,
                        regrade=True)
    finally:
        wall_s, cpu_s = time.perf_counter() - wall_before, meter.stop()
    failed = [result.student_id for result in results if not result.ok]
    if not results or failed:
        raise RuntimeError(f"grading {lab} to measure it: no grade for "
                           f"{', '.join(failed) or 'any submission (none found)'}")
    return GradingCost(lab, len(results), jobs, wall_s, cpu_s,
                       tuple((result.score, result.max_score) for result in results),
                       meter.accounting)


def projected_wall_s(cost: GradingCost, submissions: int = 300, cores: int = 16) -> float:
    """The wall time of `submissions` submissions on `cores` cores at `--jobs` = cores: the
    submissions go out in rounds of `cores`, each round as long as one submission's CPU time."""
    rounds = -(-submissions // cores)  # ceil
    return rounds * cost.cpu_s_per_submission
