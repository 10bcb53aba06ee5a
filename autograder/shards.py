"""Grading one class on several runners: shards of students, then one merged grading root.

    python -m autograder grade LAB SUBS --shard 1/2 --course-dir grading-1   # runner 1 (cpu)
    python -m autograder grade LAB SUBS --shard 2/2 --course-dir grading-2   # runner 2 (gpu)
    python -m autograder merge grading-1 grading-2 --into grading            # anywhere, after
    python -m autograder export --course-dir grading                         # as usual

A student's shard comes from a stable hash of their id (sha256; Python's hash() changes from
one process to the next), so every runner of a CI matrix picks the same students without
talking to the others, and all of a student's labs land in the same shard.

`merge` replays every shard's records (autograder/gradebook.py) into a new grading root, which
ends up as if everything had been graded there: the same gradebook rows, the same autograded
notebooks (feedback is generated from it), the same records (a later `grade` there skips what
is graded), plus any manual scores and comments given in a shard. A submission graded in more
than one root merges when the grades agree cell by cell (the first root named wins: its
notebooks, flags and manual scores are kept); when they differ, nothing is merged and the error
names the student and the roots: grade that student again in one root, then merge again.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from autograder import gradebook
from autograder.course import COURSE_ID, CourseError, gradebook_url, prepare_nbgrader
from autograder.gradebook import Record, remove_tree

SHARD = re.compile(r"^(\d+)/(\d+)$")


def shard_of(student_id: str, count: int) -> int:
    """The shard (1 to `count`) that grades `student_id`."""
    digest = hashlib.sha256(student_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the students whose shard_of is `index`."""

    index: int  # 1 to count, as CI matrices number their jobs
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`i/n` as written on the command line: "1/2", "2/2"."""
        found = SHARD.match(text.strip())
        index, count = (int(found[1]), int(found[2])) if found else (0, 0)
        if not 1 <= index <= count:
            raise CourseError(
                f"{text!r} is not a shard: write i/n with 1 <= i <= n, e.g. 1/2 and 2/2 for "
                "two runners."
            )
        return cls(index, count)

    def includes(self, student_id: str) -> bool:
        return shard_of(student_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def merge(roots: list[Path], into: Path) -> list[tuple[str, str]]:
    """Merge the grading roots `roots` into the new grading root `into`; returns the merged
    (lab, student_id) pairs. Raises CourseError, having written nothing, when they conflict."""
    roots = [Path(root).resolve() for root in roots]
    into = Path(into).resolve()
    _check_destination(into, roots)
    with ExitStack() as stack:
        for root in roots:
            if not (root / "gradebook.db").is_file():
                raise CourseError(f"{root} is not a grading root: it has no gradebook.db.")
            stack.enter_context(gradebook.writer_lock(root, shared=True))  # no grading meanwhile
        chosen, sources = _choose(roots)
        # Built beside `into` and renamed at the end: a merge either happened or did not.
        partial = into.with_name(f".{into.name}.merging")
        remove_tree(partial)
        try:
            _build(partial, chosen, sources)
            if into.exists():
                into.rmdir()  # empty: _check_destination said so
            partial.rename(into)
        finally:
            remove_tree(partial)
    return sorted(chosen)


def _check_destination(into: Path, roots: list[Path]) -> None:
    if any(into.is_relative_to(root) or root.is_relative_to(into) for root in roots):
        raise CourseError(f"--into {into} must be a new folder, apart from the roots merged.")
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise CourseError(
            f"{into} is not empty. A merged grading root is built whole: merge into a new "
            "folder (or delete this one first)."
        )


def _choose(roots: list[Path]) -> tuple[dict, dict]:
    """Which root's record each (lab, student) comes from, and which root's source each lab
    comes from; every problem found is reported at once."""
    chosen: dict[tuple[str, str], tuple[Path, Record]] = {}
    sources: dict[str, tuple[Path, str]] = {}  # lab -> (root, digest of its source notebooks)
    problems = []
    for root in roots:
        found, in_gradebook = gradebook.records(root), gradebook.graded(root)
        for lab, student_id in sorted(in_gradebook - set(found)):
            problems.append(
                f"{root}: {student_id}'s {lab} is in the gradebook without a record (an "
                "interrupted run?): run the same `grade` there again to finish it"
            )
        for (lab, student_id), found_record in sorted(found.items()):
            if (lab, student_id) not in in_gradebook:
                problems.append(f"{root}: {student_id}'s {lab} has a record but no gradebook row")
                continue
            digest = _digest(root / "source" / lab)
            first_source = sources.setdefault(lab, (root, digest))
            if first_source[1] != digest:
                problems.append(
                    f"{lab} was graded from different sources in {first_source[0]} and {root}"
                )
            if (lab, student_id) not in chosen:
                chosen[lab, student_id] = (root, found_record)
                continue
            first_root, first = chosen[lab, student_id]
            if _cell_grades(first) != _cell_grades(found_record):
                problems.append(
                    f"{student_id}'s {lab} has different grades in {first_root} "
                    f"({_total(first)}) and {root} ({_total(found_record)})"
                )
    if problems:
        raise CourseError("nothing merged:\n  " + "\n  ".join(problems))
    return chosen, sources


def _cell_grades(found: Record) -> list[tuple]:
    return sorted(
        (c["notebook"], c["grade_id"], c["auto_score"], c["max_score"])
        for c in found.result["scores"]
    )


def _total(found: Record) -> str:
    cells = found.result["scores"]
    score = sum(c["auto_score"] or 0 for c in cells)
    return f"{score:g} / {sum(c['max_score'] for c in cells):g}"


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.ipynb")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _build(dest: Path, chosen: dict, sources: dict) -> None:
    from autograder.release import generate_assignment

    dest.mkdir(parents=True)
    for lab, (root, _) in sorted(sources.items()):
        _copy_files(root / "source" / lab, dest / "source" / lab)
        generate_assignment(dest, lab)  # the gradebook learns the lab's cells, as in `grade`
    for (lab, student_id), (root, found) in sorted(chosen.items()):
        _copy_files(root / "submitted" / student_id / lab, dest / "submitted" / student_id / lab)
        gradebook.record(dest, found.grade_result(root), found.fingerprint, found.result)
    _copy_manual_grades(chosen, dest)


def _copy_files(src: Path, dest: Path) -> None:
    if not src.is_dir():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir()):
        if path.is_file():
            shutil.copyfile(path, dest / path.name)  # bytes only, never nbgrader's 444


def _copy_manual_grades(chosen: dict, dest: Path) -> None:
    """Carry over what a person gave in a shard's formgrader: manual scores, extra credit,
    comments. Recording sets automatic scores only."""
    from nbgrader.api import Gradebook

    prepare_nbgrader()
    by_root: dict[Path, list[tuple[str, str]]] = {}
    for key, (root, _) in chosen.items():
        by_root.setdefault(root, []).append(key)
    with Gradebook(gradebook_url(dest), COURSE_ID) as target:
        for root, keys in sorted(by_root.items()):
            with Gradebook(gradebook_url(root), COURSE_ID) as source:
                for lab, student_id in sorted(keys):
                    theirs = source.find_submission(lab, student_id)
                    ours = target.find_submission(lab, student_id)
                    _copy_manual(theirs, ours)
        target.db.commit()


def _copy_manual(theirs, ours) -> None:
    notebooks = {notebook.name: notebook for notebook in ours.notebooks}
    for notebook in theirs.notebooks:
        grades = {grade.name: grade for grade in notebooks[notebook.name].grades}
        for grade in notebook.grades:
            if grade.manual_score is not None or grade.extra_credit:
                mine = grades[grade.name]
                mine.manual_score, mine.extra_credit = grade.manual_score, grade.extra_credit
                mine.needs_manual_grade = grade.needs_manual_grade
        comments = {comment.name: comment for comment in notebooks[notebook.name].comments}
        for comment in notebook.comments:
            if comment.manual_comment is not None:
                comments[comment.name].manual_comment = comment.manual_comment
