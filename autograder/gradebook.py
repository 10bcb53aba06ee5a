"""The one place that writes a grading root's gradebook: recording a worker's `GradeResult`.

Workers grade in private course roots (autograder/worker.py); only this module, called in
the parent process, turns their plain results into rows of the grading root's gradebook.db
and copies their executed notebooks into autograded/, where feedback and nbgrader's own
formgrader (manual grading) expect them. One writer means no two processes ever contend
for the SQLite file, however many submissions run at once; `writer_lock` keeps a second
`grade` on the same grading root from becoming another writer.

Each recorded submission also gets a record, records/<lab>/<student>.json: the result as
plain data (with what nbgrader has no column for, such as flags) and the fingerprint of what
was graded (autograder/grade.py). The record is written last, atomically, so it marks a
result as fully recorded: a grader killed half-way through leaves no record, and the next run
grades that submission again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from autograder.course import COURSE_ID, CourseError, gradebook_url, prepare_nbgrader
from autograder.worker import GradeResult

RECORDS = "records"  # folder of the grading root holding one record per graded submission
LOCK_FILE = "grading.lock"


@dataclass(frozen=True)
class Record:
    """What was recorded for one submission of one lab."""

    fingerprint: str  # of the submission, lab source and runner profile graded (grade.py)
    result: dict  # the GradeResult as JSON data; `autograded` relative to the grading root

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(self.result.get("flags") or ())

    def grade_result(self, grading_root: Path) -> GradeResult:
        """The recorded GradeResult, its notebooks in `grading_root`'s autograded/."""
        known = {f.name for f in fields(GradeResult)}  # a record may predate or outlive a field
        data = {k: v for k, v in self.result.items() if k in known}
        data["autograded"] = str(Path(grading_root) / self.result["autograded"])
        return GradeResult.from_json(json.dumps(data))


@contextmanager
def writer_lock(grading_root: Path, shared: bool = False) -> Iterator[None]:
    """Hold the grading root's lock while writing it (or, `shared`, while reading all of it).

    An flock: the operating system drops it when its holder dies, even by SIGKILL, so a killed
    run never leaves the root locked.
    """
    grading_root = Path(grading_root)
    grading_root.mkdir(parents=True, exist_ok=True)
    with open(grading_root / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise CourseError(
                f"{grading_root} is being graded right now ({holder}). Wait for that run to "
                "finish, or grade into another --course-dir."
            ) from None
        if not shared:
            handle.truncate(0)
            handle.write(f"pid {os.getpid()}")
            handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_path(grading_root: Path, lab: str, student_id: str) -> Path:
    return Path(grading_root) / RECORDS / lab / f"{student_id}.json"


def recorded(grading_root: Path, lab: str, student_id: str) -> Record | None:
    """The record of `student_id`'s graded `lab`, or None when there is none (yet)."""
    path = record_path(grading_root, lab, student_id)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Record(fingerprint=data["fingerprint"], result=data["result"])


def records(grading_root: Path) -> dict[tuple[str, str], Record]:
    """Every record of the grading root: (lab, student_id) -> Record."""
    found = {}
    for path in sorted((Path(grading_root) / RECORDS).glob("*/*.json")):
        lab, student_id = path.parent.name, path.stem
        found[lab, student_id] = recorded(grading_root, lab, student_id)
    return found


def graded(grading_root: Path) -> set[tuple[str, str]]:
    """The (lab, student_id) pairs with a submission in the grading root's gradebook."""
    from nbgrader.api import Gradebook

    if not (Path(grading_root) / "gradebook.db").is_file():
        return set()
    prepare_nbgrader()
    with Gradebook(gradebook_url(grading_root), COURSE_ID) as gradebook:
        return {
            (assignment.name, submission.student.id)
            for assignment in gradebook.assignments
            for submission in assignment.submissions
        }


def record(
    grading_root: Path, result: GradeResult, fingerprint: str = "", data: dict | None = None
) -> Path:
    """Store a successful result's scores, notebooks and record; return its autograded folder.

    `data`: the result as a record holds it, when recording again what another grading root
    recorded (a merge), so that fields this GradeResult does not know survive.
    Order matters for a grader killed half-way: the old record goes first, the new one is
    written last, so no record ever describes a grade that was not fully stored.
    """
    from nbgrader.api import Gradebook

    if not result.ok or result.autograded is None:
        raise ValueError(f"{result.student_id}: a failed grading has nothing to record")
    prepare_nbgrader()
    lab, student_id = result.lab, result.student_id
    path = record_path(grading_root, lab, student_id)
    path.unlink(missing_ok=True)
    dest = _install_notebooks(Path(result.autograded), grading_root, lab, student_id)
    scores = {(c.notebook, c.grade_id): c for c in result.scores}
    comments = {(c.notebook, c.grade_id): c for c in result.comments}
    with Gradebook(gradebook_url(grading_root), COURSE_ID) as gradebook:
        gradebook.update_or_create_student(student_id)
        extra = {"timestamp": result.timestamp} if result.timestamp else {}
        submission = gradebook.update_or_create_submission(lab, student_id, **extra)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                cell = scores.get((notebook.name, grade.name))
                if cell is None:  # the lab changed between grading and recording
                    raise RuntimeError(f"{student_id}: no score for {notebook.name}/{grade.name}")
                grade.auto_score = cell.auto_score
                # As nbgrader does: a manual score from earlier, or none automatic, needs a person.
                grade.needs_manual_grade = grade.manual_score is not None or cell.auto_score is None
            for comment in notebook.comments:
                cell = comments.get((notebook.name, comment.name))
                comment.auto_comment = cell.auto_comment if cell else None
        gradebook.db.commit()
    data = dict(data) if data is not None else json.loads(result.to_json())
    data["autograded"] = str(dest.relative_to(grading_root))  # the root may move (merge)
    _write_atomically(path, json.dumps({"fingerprint": fingerprint, "result": data}, indent=1))
    return dest


def _install_notebooks(src: Path, grading_root: Path, lab: str, student_id: str) -> Path:
    """Copy the executed notebooks to autograded/<student>/<lab>, replacing the folder whole."""
    dest = Path(grading_root) / "autograded" / student_id / lab
    fresh = dest.with_name(f".{lab}.recording")
    remove_tree(fresh)
    fresh.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.is_file():
            shutil.copyfile(path, fresh / path.name)  # bytes only: nbgrader made its copies 444
    remove_tree(dest)
    fresh.rename(dest)
    return dest


def remove_tree(folder: Path) -> None:
    """Delete `folder` if it exists, read-only files and folders (nbgrader's 444) included."""
    folder = Path(folder)
    if not folder.exists():
        return
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(folder)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)  # atomic: a reader sees the old record or the new, never half
