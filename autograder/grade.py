"""`grade LAB [SUBMISSIONS]`: autograde learners' submissions on a runner profile.

    1. the lab's sources are copied into the grading root and generated there, so that its
       gradebook knows the lab's cells (nothing is written to the repository)
    2. each submission is copied into submitted/<student>/<lab>/ (the originals stay as they are)
    3. each one is graded by `python -m autograder.worker` in a subprocess (autograder/worker.py)
    4. each result is recorded by autograder/gradebook.py, the gradebook's one writer

Step 3 is one process per submission on purpose: it is what a sandbox will wrap and what a
pool of `--jobs N` workers will run side by side; steps 1, 2 and 4 stay in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from autograder import gradebook
from autograder.course import Course, check_student_id
from autograder.profiles import RunnerProfile
from autograder.release import copy_sources, generate_assignment
from autograder.submissions import Submission, find_submissions, stage
from autograder.worker import GradeResult, GradeTask

WORKER_LOG_TAIL = 2000  # characters of a crashed worker's stderr kept in its error


def prepare_lab(course: Course, lab: str) -> list[str]:
    """Copy solutions/LAB into the grading root's source/ and generate it there.

    Regenerated on every run, so a lab fixed after a first round of grading is graded as it
    is now. Returns the lab's notebook file names.
    """
    sources = copy_sources(course, lab, course.grading / "source" / lab)
    generate_assignment(course.grading, lab)
    return [path.name for path in sources]


def collect(
    course: Course,
    lab: str,
    folder: Path | None,
    notebook_names: list[str],
    students: list[str] | None = None,
) -> list[Submission]:
    """The submissions to grade (only `students`' when given), staged under submitted/."""
    submitted = course.grading / "submitted"
    staged_already = folder is None or Path(folder).resolve() == submitted.resolve()
    if staged_already and not submitted.is_dir():
        return []
    found = find_submissions(submitted if staged_already else Path(folder), lab, notebook_names)
    if students:
        found = [s for s in found if s.student_id in set(students)]
    if staged_already:
        return found
    staged = []
    for submission in found:
        dest = stage(submission, submitted / submission.student_id / lab)
        notebooks = tuple(dest / path.name for path in submission.notebooks)
        timestamp = dest / submission.timestamp.name if submission.timestamp else None
        staged.append(Submission(submission.student_id, notebooks, timestamp))
    return staged


def run_worker(task: GradeTask, profile: RunnerProfile) -> GradeResult:
    """Grade one submission in a worker subprocess with the profile's kernel environment."""
    scratch = Path(task.workdir).parent
    scratch.mkdir(parents=True, exist_ok=True)
    task_file, result_file = scratch / "task.json", scratch / "result.json"
    task_file.write_text(json.dumps(asdict(task), indent=1))
    command = [sys.executable, "-m", "autograder.worker", str(task_file), str(result_file)]
    # Output to a file, not a pipe: the kernel inherits it, and a learner's code may print a lot.
    with open(scratch / "worker.log", "w+b") as log:
        # Its own session, so a timeout can kill the worker and whatever it started. The
        # kernel has a session of its own (jupyter_client), and exits when it sees its
        # parent gone (ipykernel's parent poller).
        process = subprocess.Popen(
            command,
            env=profile.kernel_env(os.environ),
            cwd=scratch,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=profile.submission_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return GradeResult(
                task.lab,
                task.student_id,
                error=f"grading ran past {profile.submission_timeout_s} s and was stopped",
            )
        if result_file.is_file():
            return GradeResult.from_json(result_file.read_text())
        log.seek(max(0, log.seek(0, os.SEEK_END) - WORKER_LOG_TAIL))
        tail = log.read().decode("utf-8", "replace")
    return GradeResult(
        task.lab,
        task.student_id,
        error=f"the grading worker exited with status {process.returncode}:\n{tail}",
    )


def grade(
    course: Course,
    lab: str,
    submissions: Path | None = None,
    profile: RunnerProfile | None = None,
    students: list[str] | None = None,
    progress: bool = True,
) -> list[GradeResult]:
    """Autograde `lab`'s submissions (default: those already in the grading root)."""
    from tqdm.auto import tqdm

    from autograder.profiles import get_profile

    profile = profile or get_profile("cpu")
    profile.check_available()  # before anything is copied: a GPU profile without a GPU stops here
    for student_id in students or []:
        check_student_id(student_id)
    course.grading.mkdir(parents=True, exist_ok=True)
    names = prepare_lab(course, lab)
    found = collect(course, lab, submissions, names, students)
    if not found:
        print(f"no submissions of {lab} to grade")
        return []
    (course.grading / "tmp").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{lab}-", dir=course.grading / "tmp"))
    tasks = [
        GradeTask(
            lab=lab,
            student_id=submission.student_id,
            source=str(course.grading / "source" / lab),
            submission=str(submission.notebooks[0].parent),
            workdir=str(scratch / submission.student_id / "course"),
            cell_timeout_s=profile.cell_timeout_s,
        )
        for submission in found
    ]
    bar = tqdm(
        total=len(tasks),
        desc=f"grading {lab} ({profile.name})",
        unit="submission",
        disable=not progress or len(tasks) < 2,
    )
    results = []
    try:
        # One worker process per submission, one after another. `--jobs N` becomes a pool's
        # imap_unordered over the same tasks; recording stays here, in this one process.
        for result in (run_worker(task, profile) for task in tasks):
            if result.ok:
                gradebook.record(course.grading, result)
            results.append(result)
            bar.write(summary_line(result))
            bar.update()
    finally:
        bar.close()
        shutil.rmtree(scratch, ignore_errors=True)  # private course roots: copies only
    return results


def summary_line(result: GradeResult) -> str:
    """One line per student: score / max, or why there is no grade."""
    if not result.ok:
        first = result.error.strip().splitlines()[0] if result.error else "unknown error"
        return f"{result.student_id:<24} ERROR  {first}"
    line = f"{result.student_id:<24} {result.score:g} / {result.max_score:g}"
    if result.needs_manual_grade:
        line += f"  ({result.needs_manual_grade} cells to grade by hand)"
    return line + f"  [{result.seconds:.1f} s]"
