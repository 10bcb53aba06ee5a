"""The one place that writes the course's gradebook: recording a worker's `GradeResult`.

Workers grade in private course roots (autograder/worker.py); only this module, called in
the parent process, turns their plain results into rows of the grading root's gradebook.db
and copies their executed notebooks into autograded/, where feedback and nbgrader's own
formgrader (manual grading) expect them. One writer means no two processes ever contend
for the SQLite file, however many submissions run at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from autograder.course import COURSE_ID, gradebook_url, prepare_nbgrader
from autograder.worker import GradeResult


def record(grading_root: Path, result: GradeResult) -> Path:
    """Store a successful result's scores and notebooks; return its autograded folder."""
    from nbgrader.api import Gradebook

    if not result.ok or result.autograded is None:
        raise ValueError(f"{result.student_id}: a failed grading has nothing to record")
    prepare_nbgrader()
    lab, student_id = result.lab, result.student_id
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
    return _install_notebooks(Path(result.autograded), grading_root, lab, student_id)


def _install_notebooks(src: Path, grading_root: Path, lab: str, student_id: str) -> Path:
    dest = Path(grading_root) / "autograded" / student_id / lab
    if dest.exists():
        _make_writable(dest)
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        if path.is_file():
            shutil.copyfile(path, dest / path.name)  # bytes only: nbgrader made its copies 444
    return dest


def _make_writable(folder: Path) -> None:
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
