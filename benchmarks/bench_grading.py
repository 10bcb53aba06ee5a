"""What grading one Lab 1 submission costs, end to end, as `python -m autograder grade` runs it.

    solution graded, wall per submission   one `grade` call with one submission: the lab's
                                           source generated into the grading root, a worker
                                           process, an nbgrader kernel running every cell and
                                           the hidden tests (race detector included), the
                                           gradebook written. Target: under 60 s on the cpu
                                           runner, so a class of 100 grades in under two hours
                                           on one core.
    release graded, wall per submission    the untouched release: every stub fails at once,
                                           so this is the grader's fixed cost per submission
    grading / plain run of the solution    the same notebook executed by nbclient alone, no
                                           grader and no hidden tests: what the pipeline adds

On the gpu runner the same figures are reported without the 60 s target, which is set for
the simulator; the grading kernel always runs the runner this machine has. --quick grades the
release once, nothing else: the whole pipeline at its fixed cost (the solution's minute of
kernels is graded by tests/test_grading_lab1.py).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import Row

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab1_cuda_kernels"
NOTEBOOK = f"{LAB}.ipynb"
TARGET_S = 60.0


def _grade_once(course, submissions: Path, profile) -> tuple[float, float, str]:
    """(wall seconds of one grade call, the worker's own seconds, "score / max")."""
    from autograder.grade import grade

    start = time.perf_counter()
    (result,) = grade(course, LAB, submissions, profile, progress=False)
    wall = time.perf_counter() - start
    if not result.ok:  # a timing of a failed grade means nothing: stop the benchmark
        raise RuntimeError(f"grading {result.student_id} failed: {result.error}")
    return wall, result.seconds, f"{result.score:g} / {result.max_score:g}"


def _plain_run(path: Path, folder: Path) -> float:
    """Wall seconds to execute the notebook top to bottom in a fresh kernel, nothing else."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def run(quick: bool) -> list[Row]:
    import contextlib
    import io

    import gpulab
    from autograder.course import Course
    from autograder.profiles import get_profile

    runner = gpulab.runner.name
    profile = get_profile(runner)
    repeat = 1 if quick else 5
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        tmp = Path(tmp)
        course = Course.at(ROOT, tmp / "grading")
        sources = {"solution": ROOT / "solutions" / LAB / NOTEBOOK,
                   "release": ROOT / "labs" / LAB / NOTEBOOK}
        if quick:  # a smoke test: the release once
            del sources["solution"]
        medians = {}
        for name, source in sources.items():
            reps = repeat if name == "solution" else max(1, repeat // 2)
            runs = []
            for k in range(reps):
                # A new learner each time: the grader keeps the grade of a submission it has
                # already graded unchanged, and that is not what is measured here.
                submissions = tmp / f"{name}-{k}"
                (submissions / f"{name}-{k}").mkdir(parents=True)
                shutil.copyfile(source, submissions / f"{name}-{k}" / NOTEBOOK)
                with contextlib.redirect_stdout(io.StringIO()):  # grade's one-line summaries
                    runs.append(_grade_once(course, submissions, profile))
            wall = statistics.median(r[0] for r in runs)
            worker = statistics.median(r[1] for r in runs)
            medians[name] = wall
            on_target = name == "solution" and runner == "cpu"
            rows.append(Row(
                "grading", f"lab1 {name} graded, wall per submission", wall, "s",
                target=f"< {TARGET_S:g} s" if on_target else "",
                ok=(wall < TARGET_S) if on_target else None,
                note=f"{runner} runner, median of {reps}; in the worker {worker:.1f} s; "
                     f"scored {runs[-1][2]}"))
        if not quick:
            plain = _plain_run(sources["solution"], tmp)
            rows.append(Row(
                "grading", "lab1 solution: grading / plain notebook run", medians["solution"] /
                plain, "x", note=f"plain nbclient run {plain:.1f} s, no hidden tests"))
    return rows
