"""Finding learners' submissions, and staging copies of them for nbgrader.

A folder of submissions holds one folder per student, in either layout:

    <student_id>/<lab>.ipynb          as handed in (one folder per learner)
    <student_id>/<lab>/<lab>.ipynb    nbgrader's own submitted/ layout (nbgrader collect)

The files found are only ever read: nbgrader works on copies in the grading root.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from autograder.course import STUDENT_ID

TIMESTAMP = "timestamp.txt"  # nbgrader's record of when a submission was handed in


@dataclass(frozen=True)
class Submission:
    """One learner's notebooks for one lab."""

    student_id: str
    notebooks: tuple[Path, ...]  # the lab's notebooks that this learner handed in
    timestamp: Path | None = None  # nbgrader's timestamp.txt, when there is one


def find_submissions(folder: Path, lab: str, notebook_names: list[str]) -> list[Submission]:
    """The submissions of `lab` in `folder`, sorted by student id.

    `notebook_names` are the lab's notebook file names ("lab1_cuda_kernels.ipynb"). A student
    folder with none of them is skipped with a warning; one with only some is graded (nbgrader
    gives a missing notebook zero).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no submissions folder {folder}")
    found = []
    for student_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not STUDENT_ID.match(student_dir.name):
            print(f"skipped {student_dir}: {student_dir.name!r} is not a usable student id")
            continue
        base = student_dir / lab if (student_dir / lab).is_dir() else student_dir
        notebooks = tuple(base / name for name in notebook_names if (base / name).is_file())
        if not notebooks:
            print(f"skipped {student_dir}: no {' or '.join(notebook_names)} in it")
            continue
        timestamp = base / TIMESTAMP
        found.append(
            Submission(student_dir.name, notebooks, timestamp if timestamp.is_file() else None)
        )
    return found


def stage(submission: Submission, dest: Path) -> Path:
    """Copy a submission's notebooks (and timestamp) into the fresh folder `dest`.

    Copies bytes, never permissions or the original: nbgrader's autograde rewrites what it
    grades, and the learner's file must stay exactly as it was handed in.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in submission.notebooks:
        shutil.copyfile(path, dest / path.name)
    if submission.timestamp is not None:
        shutil.copyfile(submission.timestamp, dest / TIMESTAMP)
    return dest
