"""`grade LAB [SUBMISSIONS]`: autograde learners' submissions on a runner profile.

    1. the lab's sources are copied into the grading root and generated there, so that its
       gradebook knows the lab's cells (nothing is written to the repository)
    2. the submissions (of one shard, with `--shard i/n`) are copied into
       submitted/<student>/<lab>/; the originals are only ever read
    3. a submission already recorded with the same fingerprint (its notebooks, the lab's
       source, the runner profile) keeps its grade, unless `regrade`
    4. the others are graded by `python -m autograder.worker` subprocesses, `jobs` at a time
       (autograder/pool.py), with the lab's expected answers computed once, beforehand, in a
       process of their own, for each student (autograder/answers.py), and the lab generated
       once in a root of its own that each worker copies (`lab_alone`)
    5. each result is recorded by autograder/gradebook.py, in this process and in student
       order, whatever `jobs` is

Steps 1, 2 and 5 stay in this process, which holds the grading root's lock for the whole run.
A run that was killed leaves neither a lock nor a half-recorded grade (gradebook.record), but
maybe worker folders and processes under tmp/: the next run ends and removes them first. So
re-running the same command after a kill finishes the batch with the grades an uninterrupted
run would have given.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path

from autograder import gradebook
from autograder.answers import compute_answers
from autograder.course import Course, check_student_id
from autograder.gradebook import Record, remove_tree
from autograder.pool import WorkerPool, kill_leftovers
from autograder.profiles import RunnerProfile
from autograder.release import copy_sources, generate_assignment
from autograder.shards import Shard
from autograder.submissions import Submission, find_submissions, stage
from autograder.worker import GradeResult, GradeTask


def prepare_lab(course: Course, lab: str) -> list[str]:
    """Copy solutions/LAB into the grading root's source/ and generate it there.

    Regenerated on every run, so a lab fixed after a first round of grading is graded as it
    is now. Returns the lab's notebook file names.
    """
    sources = copy_sources(course, lab, course.grading / "source" / lab)
    generate_assignment(course.grading, lab)
    return [path.name for path in sources]


def lab_alone(course: Course, lab: str, root: Path) -> Path:
    """A course root at `root` holding `lab` alone, generated: its source and a gradebook
    that knows its cells and nothing of any learner, which each worker copies."""
    copy_sources(course, lab, root / "source" / lab)
    generate_assignment(root, lab)
    return root


def collect(
    course: Course,
    lab: str,
    folder: Path | None,
    notebook_names: list[str],
    students: list[str] | None = None,
    shard: Shard | None = None,
) -> list[Submission]:
    """The submissions to grade (only `students`' and `shard`'s when given), staged under
    submitted/, sorted by student id."""
    submitted = course.grading / "submitted"
    staged_already = folder is None or Path(folder).resolve() == submitted.resolve()
    if staged_already and not submitted.is_dir():
        return []
    found = find_submissions(submitted if staged_already else Path(folder), lab, notebook_names)
    if students:
        found = [s for s in found if s.student_id in set(students)]
    if shard is not None:
        found = [s for s in found if shard.includes(s.student_id)]
    if staged_already:
        return found
    staged = []
    for submission in found:
        dest = _stage_whole(submission, submitted / submission.student_id / lab, course.grading)
        notebooks = tuple(dest / path.name for path in submission.notebooks)
        timestamp = dest / submission.timestamp.name if submission.timestamp else None
        staged.append(Submission(submission.student_id, notebooks, timestamp))
    return staged


def _stage_whole(submission: Submission, dest: Path, grading_root: Path) -> Path:
    # Staged beside, then moved into place: a run killed while copying leaves no half-copied
    # submission for a later run to grade.
    fresh = stage(submission, grading_root / "tmp" / f"staging-{submission.student_id}")
    remove_tree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fresh.rename(dest)
    return dest


def fingerprint(source: Path, submission: Submission, profile: RunnerProfile) -> str:
    """What a grade depends on, hashed: the lab's source notebooks (answers and hidden tests),
    the submitted notebooks and timestamp, and the runner profile. Same fingerprint, same grade.
    """
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:  # length-prefixed: no two inputs hash alike
        digest.update(f"{label}\0{len(data)}\0".encode() + data)

    for path in sorted(Path(source).glob("*.ipynb")):
        add(f"source/{path.name}", path.read_bytes())
    for path in submission.notebooks:
        add(f"submitted/{path.name}", path.read_bytes())
    if submission.timestamp is not None:
        add("timestamp", submission.timestamp.read_bytes())
    settings = {f.name: getattr(profile, f.name) for f in fields(profile)}
    add("profile", json.dumps(settings, sort_keys=True, default=_plain).encode())
    return digest.hexdigest()


def _plain(value):
    return dict(value) if hasattr(value, "items") else str(value)


def already_graded(grading_root: Path, lab: str, prints: dict[str, str]) -> dict[str, Record]:
    """The students whose grade of `lab` is fully recorded for the fingerprint in `prints`."""
    in_gradebook = {student for name, student in gradebook.graded(grading_root) if name == lab}
    done = {}
    for student_id, expected in prints.items():
        found = gradebook.recorded(grading_root, lab, student_id)
        autograded = Path(grading_root) / "autograded" / student_id / lab
        if (
            found is not None
            and found.fingerprint == expected
            and student_id in in_gradebook
            and autograded.is_dir()
        ):
            done[student_id] = found
    return done


def clean_scratch(grading_root: Path) -> None:
    """End the processes and remove the folders a killed run left in grading_root/tmp/."""
    tmp = Path(grading_root) / "tmp"
    if not tmp.is_dir():
        return
    killed = kill_leftovers(tmp)
    if killed:
        print(f"ended {killed} grading processes left running by an earlier, interrupted run")
    for path in sorted(tmp.iterdir()):
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            path.unlink()


def grade(
    course: Course,
    lab: str,
    submissions: Path | None = None,
    profile: RunnerProfile | None = None,
    students: list[str] | None = None,
    progress: bool = True,
    jobs: int = 1,
    shard: Shard | None = None,
    regrade: bool = False,
) -> list[GradeResult]:
    """Autograde `lab`'s submissions (default: those already in the grading root), `jobs` at a
    time; one result per submission, sorted by student id."""
    from autograder.profiles import get_profile

    profile = profile or get_profile("cpu")
    profile.check_available()  # before anything is copied: a GPU profile without a GPU stops here
    for student_id in students or []:
        check_student_id(student_id)
    with gradebook.writer_lock(course.grading):
        clean_scratch(course.grading)
        (course.grading / "tmp").mkdir(exist_ok=True)
        names = prepare_lab(course, lab)
        found = collect(course, lab, submissions, names, students, shard)
        if not found:
            print(f"no submissions of {lab} to grade" + (f" in shard {shard}" if shard else ""))
            return []
        source = course.grading / "source" / lab
        prints = {s.student_id: fingerprint(source, s, profile) for s in found}
        done = {} if regrade else already_graded(course.grading, lab, prints)
        results = {}
        for student_id, found_record in done.items():
            results[student_id] = found_record.grade_result(course.grading)
            print(summary_line(results[student_id], "already graded"))
        todo = [s for s in found if s.student_id not in done]
        if todo:
            results.update(_grade_batch(course, lab, todo, profile, prints, jobs, progress))
        return [results[s.student_id] for s in found]


def _grade_batch(course, lab, todo, profile, prints, jobs, progress) -> dict[str, GradeResult]:
    from tqdm.auto import tqdm

    # One folder per run, holding one per submission: the worker's task, result, log and its
    # private course root (answers and hidden tests): removed at the end of the run, or by
    # the next run when this one is killed.
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=course.grading / "tmp"))
    source = course.grading / "source" / lab
    answers = compute_answers(lab, source, profile.kernel_env(os.environ),
                              [submission.student_id for submission in todo],
                              timeout_s=profile.submission_timeout_s)
    # ".lab": no student id starts with a dot (course.STUDENT_ID), so no worker folder clashes
    lab_root = lab_alone(course, lab, scratch / ".lab")
    tasks = [
        GradeTask(
            lab=lab,
            student_id=submission.student_id,
            lab_root=str(lab_root),
            submission=str(submission.notebooks[0].parent),
            workdir=str(scratch / submission.student_id / "course"),
            cell_timeout_s=profile.cell_timeout_s,
            sandbox=asdict(profile.sandbox_settings()),
            answers=answers[submission.student_id],
        )
        for submission in todo
    ]
    bar = tqdm(
        total=len(tasks),
        desc=f"grading {lab} ({profile.name}, {jobs} at a time)",
        unit="submission",
        disable=not progress or len(tasks) < 2,
    )
    results = {}
    try:
        with WorkerPool(profile, jobs) as pool:
            for result in pool.map(tasks):
                if result.ok:
                    dest = gradebook.record(course.grading, result, prints[result.student_id])
                    result = replace(result, autograded=str(dest))
                else:
                    _forget_if_stale(course.grading, lab, result.student_id, prints)
                results[result.student_id] = result
                bar.write(summary_line(result))
                bar.update()
    finally:
        bar.close()
        remove_tree(scratch)  # private course roots: copies only
    return results


def _forget_if_stale(grading_root: Path, lab: str, student_id: str, prints: dict) -> None:
    """A submission handed in again that could not be graded: its old record describes
    another notebook, so it goes (the export then flags the old grade as not recorded)."""
    found = gradebook.recorded(grading_root, lab, student_id)
    if found is not None and found.fingerprint != prints[student_id]:
        gradebook.record_path(grading_root, lab, student_id).unlink()


def summary_line(result: GradeResult, note: str = "") -> str:
    """One line per student: score / max, or why there is no grade."""
    if not result.ok:
        first = result.error.strip().splitlines()[0] if result.error else "unknown error"
        return f"{result.student_id:<24} ERROR  {first}"
    line = f"{result.student_id:<24} {result.score:g} / {result.max_score:g}"
    if result.needs_manual_grade:
        line += f"  ({result.needs_manual_grade} cells to grade by hand)"
    flags = getattr(result, "flags", ())  # integrity notes, where the result carries them
    if flags:
        line += f"  flagged: {'; '.join(flags)}"
    if result.warnings:  # autograder/sandbox.py: what confined the learner's code less
        line += f"  WEAKER SANDBOX: {'; '.join(w.split(':')[0] for w in result.warnings)}"
    return line + (f"  ({note})" if note else f"  [{result.seconds:.1f} s]")
