"""`export`: the gradebook as a CSV, one row per (student, lab).

Columns: student_id, lab, score, max_score, needs_manual_grade, flags. `score` counts manual
scores where a person gave one (nbgrader's rule). `flags` is a ';'-separated list of notes
about a submission that a person should look at: the grading result's flags (an integrity
check that failed, say), from the submission's record (autograder/gradebook.py), and
NOT_RECORDED where the gradebook has a row that no record completes, and a late submission
(handed in after the deadline `publish --due` recorded) with how late it was.

A grading root merged from shards (autograder/shards.py) exports like any other.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from autograder.course import COURSE_ID, Course, prepare_nbgrader
from autograder.gradebook import records

COLUMNS = ("student_id", "lab", "score", "max_score", "needs_manual_grade", "flags")
NOT_RECORDED = "not fully recorded: run the same grade command again to finish it"


@dataclass(frozen=True)
class Row:
    """One learner's grade for one lab."""

    student_id: str
    lab: str
    score: float
    max_score: float
    needs_manual_grade: bool  # some cell still waits for a person
    flags: tuple[str, ...] = ()  # notes for a person: GradeResult.flags, NOT_RECORDED

    def as_csv(self) -> list[str]:
        return [
            self.student_id,
            self.lab,
            f"{self.score:g}",
            f"{self.max_score:g}",
            "yes" if self.needs_manual_grade else "no",
            ";".join(self.flags),
        ]


def rows(course: Course) -> list[Row]:
    """Every graded submission in the grading root's gradebook, sorted by lab then student."""
    from nbgrader.api import Gradebook

    if not (course.grading / "gradebook.db").is_file():
        return []
    prepare_nbgrader()
    recorded = records(course.grading)
    found = []
    with Gradebook(course.gradebook_url, COURSE_ID) as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                key = (assignment.name, submission.student.id)
                found.append(
                    Row(
                        student_id=submission.student.id,
                        lab=assignment.name,
                        score=float(submission.score),
                        max_score=float(submission.max_score),
                        needs_manual_grade=bool(submission.needs_manual_grade),
                        flags=(*(recorded[key].flags if key in recorded else (NOT_RECORDED,)),
                               *late_flag(submission.total_seconds_late)),
                    )
                )
    return sorted(found, key=lambda row: (row.lab, row.student_id))


def late_flag(seconds_late: float) -> tuple[str, ...]:
    """("late by 2h05m",) for a submission handed in after its deadline; () otherwise."""
    if seconds_late <= 0:
        return ()
    minutes = int(seconds_late // 60) + (seconds_late % 60 > 0)
    return (f"late by {minutes // 60}h{minutes % 60:02d}m",)


def to_csv(table: list[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(row.as_csv() for row in table)
    return buffer.getvalue()


def export(course: Course, output: Path) -> list[Row]:
    """Write the grades CSV to `output`; returns its rows."""
    table = rows(course)
    Path(output).write_text(to_csv(table))
    return table
