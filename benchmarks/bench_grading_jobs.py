"""`grade --jobs 2` against `grade --jobs 1`: one batch graded both ways, each into a fresh root.

    full    20 Lab 1 submissions: the solution under 16 student ids, and the 4 first known
            mistakes of tests/grading_specs.py's LAB1 (each fails one part)
    quick   2 fixture-lab submissions (tests/fixtures), one right, one wrong: a smoke test

    --jobs 2 / --jobs 1 speedup   wall time of the whole `grade` call (the lab generated into
                                  the grading root, every worker, every gradebook write).
                                  Target on a 2-core machine: at least 1.6x, which leaves the
                                  serial parts (generating the lab, recording results) and the
                                  workers' contention for memory bandwidth 0.4x between them.

Both runs must give the same grades, or the row is marked missed whatever the speedup. The
ratio means something only on an otherwise idle machine: other work on the cores counts
against the parallel run. The note gives the cores this process could use.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import Row

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.6
FULL_BATCH, MISTAKEN = 20, 4


def _lab1_batch(folder: Path):
    """20 Lab 1 submissions in `folder`; returns (course root, lab)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from grading_specs import LAB1

    lab = LAB1.lab
    for mistake in LAB1.mistakes[:MISTAKEN]:
        lab.hand_in(folder, mistake.student_id, lab.with_mistake(mistake))
    for i in range(FULL_BATCH - MISTAKEN):
        lab.hand_in(folder, f"learner{i:02d}", lab.solution())
    return ROOT, LAB1.name


def _fixture_batch(folder: Path, scratch: Path):
    """2 fixture-lab submissions (one right, one with a wrong part); returns (course root,
    lab)."""
    import nbformat

    lab = "lab0_fixture"
    shutil.copytree(ROOT / "tests" / "fixtures" / "solutions", scratch / "solutions")
    source = nbformat.read(scratch / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    for i, wrong in enumerate((False, True)):
        nb = nbformat.from_dict(source)
        if wrong:
            cell = next(c for c in nb.cells if c.get("id") == "mean")
            cell.source = cell.source.replace("return sum(xs) / len(xs)", "return xs[0]")
        (folder / f"learner{i}").mkdir(parents=True)
        nbformat.write(nb, folder / f"learner{i}" / f"{lab}.ipynb")
    return scratch, lab


def _grade(root: Path, lab: str, submissions: Path, grading: Path, jobs: int):
    """(wall seconds, {student: (score, max)}) of one `grade` call into a fresh grading root."""
    from autograder.course import Course
    from autograder.grade import grade

    course = Course.at(root, grading)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # one line per learner: not for this table
        results = grade(course, lab, submissions, jobs=jobs, progress=False)
    wall = time.perf_counter() - start
    failed = [r.student_id for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"grading failed for {failed}: {results[0].error}")
    return wall, {r.student_id: (r.score, r.max_score) for r in results}


def run(quick: bool) -> list[Row]:
    import gpulab

    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        scratch = Path(tmp)
        submissions = scratch / "subs"
        submissions.mkdir()
        root, lab = _fixture_batch(submissions, scratch) if quick else _lab1_batch(submissions)
        count = len(list(submissions.iterdir()))
        serial, grades_1 = _grade(root, lab, submissions, scratch / "jobs-1", jobs=1)
        parallel, grades_2 = _grade(root, lab, submissions, scratch / "jobs-2", jobs=2)
    same = grades_1 == grades_2
    ratio = serial / parallel
    note = (f"{count} {lab} submissions, {gpulab.runner.name} runner, {cores} cores"
            + ("" if same else "; GRADES DIFFER between the two runs"))
    return [
        Row("grading_jobs", "grade --jobs 1, whole batch", serial, "s", note=note),
        Row("grading_jobs", "grade --jobs 2, whole batch", parallel, "s", note=note),
        Row("grading_jobs", "--jobs 2 / --jobs 1 speedup", ratio, "x",
            target=f">= {TARGET}x", ok=same and ratio >= TARGET, note=note),
    ]
