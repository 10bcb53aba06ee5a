"""What the grading sandbox costs: one submission graded with its kernel sandboxed, and not.

    sandboxed / unsandboxed grading time    bubblewrap, the jail (a scratch copy, a uid of its
                                            own), rlimits and ipc sockets around the kernel;
                                            target at most 1.3x
    (same, worker only)                     the part of it inside the worker process: kernel
                                            start, the notebook's cells, shutdown and cleanup

The submission is the lab's own solution: Lab 1 (Numba kernels on the simulator, about 10 s),
or with --quick the fixture lab (pure Python, a few seconds). Runs alternate sandboxed and
unsandboxed, each in a fresh grading root, and the medians are compared, so that a busy
machine weighs on both sides alike.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from common import Row

HERE = Path(__file__).resolve().parent
TARGET = 1.3


def _lab(quick: bool) -> tuple[Path, str]:
    if quick:
        return HERE.parent / "tests" / "fixtures" / "solutions", "lab0_fixture"
    return HERE.parent / "solutions", "lab1_cuda_kernels"


def run(quick: bool) -> list[Row]:
    from autograder.course import Course
    from autograder.grade import grade
    from autograder.profiles import get_profile
    from autograder.sandbox import confinement

    solutions, lab = _lab(quick)
    repeat = 1 if quick else 3
    profile = get_profile("cpu")
    times: dict[bool, list[float]] = {True: [], False: []}
    worker: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        root = Path(tmp)
        shutil.copytree(solutions / lab, root / "solutions" / lab)
        submission = root / "submissions" / "ada"
        submission.mkdir(parents=True)
        for notebook in (root / "solutions" / lab).glob("*.ipynb"):
            shutil.copyfile(notebook, submission / notebook.name)
        for i in range(repeat):
            for sandboxed in (True, False):
                course = Course.at(root, root / f"grading-{i}-{sandboxed}")
                start = time.perf_counter()
                (result,) = grade(course, lab, root / "submissions",
                                  replace(profile, sandboxed=sandboxed), progress=False)
                times[sandboxed].append(time.perf_counter() - start)
                worker[sandboxed].append(result.seconds)
                if not result.ok or result.score != result.max_score:
                    raise RuntimeError(f"the solution of {lab} was not graded full marks: "
                                       f"{result.error or result.score}")

    weaker = confinement().weaknesses(profile.sandbox_settings())
    note = f"{lab} solution, median of {repeat}, {profile.name} runner" + (
        f"; WEAKER SANDBOX: {'; '.join(weaker)}" if weaker else ", full sandbox")
    rows = []
    for label, measured in (("", times), (", worker only", worker)):
        on, off = statistics.median(measured[True]), statistics.median(measured[False])
        rows.append(Row("sandbox", f"sandboxed grading time{label}", on, "s", note=note))
        rows.append(Row("sandbox", f"unsandboxed grading time{label}", off, "s", note=note))
        ratio = on / off
        rows.append(Row("sandbox", f"sandboxed / unsandboxed grading time{label}", ratio, "x",
                        target=f"<= {TARGET}x", ok=ratio <= TARGET, note=note))
    return rows
