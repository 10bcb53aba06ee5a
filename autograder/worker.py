"""Grade one submission, alone: its own process, its own nbgrader course root, its own kernel.

    python -m autograder.worker TASK.json RESULT.json

The parent (autograder/grade.py) writes a `GradeTask`, starts this module in a subprocess with
the runner profile's environment, and reads back a `GradeResult`: plain data, no gradebook
handle. The worker builds a private course root in `task.workdir` (the lab's sources and
gradebook, copied from the run's generated lab, and this one submission), admits the submission
(autograder/cells.py: unreadable notebooks, duplicated or deleted cells), runs nbgrader
autograde there with GradeExecute in place of nbgrader's Execute (autograder/execute.py), and
reports the scores with the flags and per-cell reasons an instructor should see.
So a submission that crashes or hangs its kernel costs only its own grade, the shared
gradebook is written by the parent alone, and the whole worker command is the unit that a
sandbox (bubblewrap, rlimits) or a pool of `--jobs N` processes wraps.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from autograder.course import (
    failure_cause,
    gradebook_url,
    nbgrader_config,
    nbgrader_log,
    prepare_nbgrader,
)

LOG_TAIL_LINES = 15  # of nbgrader's log, kept in an error so the instructor sees why


@dataclass(frozen=True)
class GradeTask:
    """What one worker grades, and where; paths are strings so the task is plain JSON."""

    lab: str
    student_id: str
    # A course root holding the lab alone, generated once per run by the parent: source/LAB/
    # (answers and hidden tests) and a gradebook that knows the lab's cells. Each worker starts
    # its private root as a copy of it, instead of generating the lab again (seconds each).
    lab_root: str
    submission: str  # folder of this learner's notebooks (and timestamp.txt)
    workdir: str  # empty folder: becomes this submission's private nbgrader course root
    cell_timeout_s: int  # per cell, from the runner profile
    # The kernel's sandbox: autograder.sandbox.SandboxSettings as plain data (empty: its
    # defaults, sandbox on); from RunnerProfile.sandbox_settings().
    sandbox: dict = field(default_factory=dict)
    # Expected answers the test cells name (autograder/answers.py), computed by the parent
    # outside any learner's kernel, for this student: name -> plain value.
    answers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CellScore:
    """The automatic grade of one grade cell (a test cell, or a manually graded answer)."""

    notebook: str
    grade_id: str
    auto_score: float | None  # None: a person has to grade it
    max_score: float
    needs_manual_grade: bool


@dataclass(frozen=True)
class CellComment:
    """nbgrader's automatic comment on one answer cell ("No response." when left unchanged)."""

    notebook: str
    grade_id: str
    auto_comment: str | None


@dataclass(frozen=True)
class CellReason:
    """Why one cell did not run as written: what the instructor reads next to its score."""

    notebook: str
    cell: str  # its grade_id, else "cell N"; or a notebook's file name
    reason: str  # "the kernel died while running test_mean (killed by SIGSEGV ...)"


@dataclass(frozen=True)
class GradeResult:
    """What grading one submission produced; `error` set means no grade was given."""

    lab: str
    student_id: str
    scores: tuple[CellScore, ...] = ()
    comments: tuple[CellComment, ...] = ()
    autograded: str | None = None  # folder of the executed notebooks, inside the workdir
    timestamp: str | None = None  # when it was handed in (ISO 8601), if known
    error: str | None = None
    seconds: float = 0.0
    # What was weaker than the full sandbox while grading (Confinement.weaknesses), if anything.
    warnings: tuple[str, ...] = ()
    # Notes for a person ("tampered: builtins.isinstance", "timeout: test_mean", "kernel
    # died: ...", "output capped: ...", "duplicated cell: ..."), and the reasons behind them.
    flags: tuple[str, ...] = ()
    reasons: tuple[CellReason, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def score(self) -> float:
        return sum(cell.auto_score or 0.0 for cell in self.scores)

    @property
    def max_score(self) -> float:
        return sum(cell.max_score for cell in self.scores)

    @property
    def needs_manual_grade(self) -> int:
        return sum(cell.needs_manual_grade for cell in self.scores)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> GradeResult:
        data = json.loads(text)
        data["scores"] = tuple(CellScore(**cell) for cell in data["scores"])
        data["comments"] = tuple(CellComment(**cell) for cell in data["comments"])
        data["warnings"] = tuple(data.get("warnings") or ())
        data["flags"] = tuple(data.get("flags") or ())
        data["reasons"] = tuple(CellReason(**reason) for reason in data.get("reasons") or ())
        return cls(**data)


def autograde_config(root: Path, task: GradeTask):
    """nbgrader autograde, as this course runs it (see autograder/scoring.py for the rule)."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute, SaveAutoGrades

    from autograder.execute import SandboxedGradeExecute
    from autograder.sandbox import SandboxSettings
    from autograder.scoring import SaveAutoGradesOnRaise

    default = Autograde.class_traits()["autograde_preprocessors"].default()
    # GradeExecute (autograder/execute.py): integrity checks, output caps, kernel restarts.
    ours = {SaveAutoGrades: SaveAutoGradesOnRaise, Execute: SandboxedGradeExecute}
    return nbgrader_config(
        root,
        task.lab,
        task.student_id,
        **{
            "Autograde.force": True,
            "Autograde.autograde_preprocessors": [ours.get(p, p) for p in default],
            "Execute.timeout": task.cell_timeout_s,
            "GradeExecute.answers": task.answers,
            # The learner's code runs in a sandboxed kernel (autograder/sandbox.py).
            "SandboxedKernelManager.sandbox": asdict(SandboxSettings(**task.sandbox)),
            # A learner who deletes a test cell gets it back (and runs it), not a free pass.
            "OverwriteCells.add_missing_cells": True,
        },
    )


def grade_submission(task: GradeTask) -> GradeResult:
    """Autograde one submission in task.workdir; runs the learner's code in a fresh kernel."""
    from nbgrader.api import Gradebook
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    from autograder.cells import admit_submission

    started = time.perf_counter()
    prepare_nbgrader()
    root = Path(task.workdir)
    submitted = root / "submitted" / task.student_id / task.lab
    try:
        with nbgrader_log() as log:
            _copy_folder(Path(task.lab_root) / "source" / task.lab, root / "source" / task.lab)
            shutil.copyfile(Path(task.lab_root) / "gradebook.db", root / "gradebook.db")
            _copy_folder(Path(task.submission), submitted)
            found = admit_submission(submitted, root / "source" / task.lab)
            if found.unreadable:  # nothing to grade: the learner should hand in a notebook
                return GradeResult(
                    task.lab,
                    task.student_id,
                    error="; ".join(f"{name}: {why}" for name, why in found.unreadable.items()),
                    seconds=time.perf_counter() - started,
                    flags=tuple(found.record.flag_lines()),
                )
            config = autograde_config(root, task)
            Autograde(coursedir=CourseDirectory(config=config), config=config).start()
    except Exception as exc:  # nbgrader reports a failed notebook as a generic exception
        cause = failure_cause(log.getvalue()) or f"{type(exc).__name__}: {exc}"
        tail = log.getvalue().strip().splitlines()[-LOG_TAIL_LINES:]
        return GradeResult(
            task.lab,
            task.student_id,
            error="\n".join([cause, *tail]),
            seconds=time.perf_counter() - started,
        )

    with Gradebook(gradebook_url(root)) as gradebook:
        submission = gradebook.find_submission(task.lab, task.student_id)
        scores, comments = [], []
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                scores.append(
                    CellScore(
                        notebook.name,
                        grade.name,
                        grade.auto_score,
                        grade.max_score,
                        bool(grade.needs_manual_grade),
                    )
                )
            for comment in notebook.comments:
                comments.append(CellComment(notebook.name, comment.name, comment.auto_comment))
        timestamp = submission.timestamp.isoformat() if submission.timestamp else None
    flags, reasons = _what_happened(root / "autograded" / task.student_id / task.lab, found.record)
    return GradeResult(
        lab=task.lab,
        student_id=task.student_id,
        scores=tuple(sorted(scores, key=lambda c: (c.notebook, c.grade_id))),
        comments=tuple(sorted(comments, key=lambda c: (c.notebook, c.grade_id))),
        autograded=str(root / "autograded" / task.student_id / task.lab),
        timestamp=timestamp,
        seconds=time.perf_counter() - started,
        flags=flags,
        reasons=reasons,
    )


def _what_happened(autograded: Path, before) -> tuple[tuple[str, ...], tuple[CellReason, ...]]:
    """Flags and reasons: the submission's (`before`, a cells.Record) and each notebook's, as
    GradeExecute left them in its metadata."""
    import nbformat

    from autograder.execute import METADATA_KEY

    flags = before.flag_lines()
    reasons = [CellReason("", cell, reason) for cell, reason in before.reasons]
    for path in sorted(autograded.glob("*.ipynb")):
        found = nbformat.read(path, as_version=4).metadata.get(METADATA_KEY, {})
        flags += [flag for flag in found.get("flags", ()) if flag not in flags]
        reasons += [CellReason(path.stem, r["cell"], r["reason"]) for r in found.get("reasons", ())]
    return tuple(flags), tuple(reasons)


def sandbox_warnings(task: GradeTask) -> tuple[str, ...]:
    """What was weaker than the full sandbox for this task's kernel, one sentence each."""
    from autograder.sandbox import SandboxSettings, confinement

    return confinement().weaknesses(SandboxSettings(**task.sandbox))


def _copy_folder(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.iterdir()):
        if path.is_file():
            shutil.copyfile(path, dest / path.name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m autograder.worker TASK.json RESULT.json", file=sys.stderr)
        return 2
    task = GradeTask(**json.loads(Path(argv[0]).read_text()))
    # The private course root holds answers and hidden tests: no other user may even look in
    # (the kernel's uid, where bubblewrap is missing and only the uid stands in the way).
    Path(task.workdir).mkdir(mode=0o700, parents=True, exist_ok=True)
    Path(task.workdir).chmod(0o700)
    try:
        result = grade_submission(task)
    except Exception:  # never leave the parent without a result to record
        result = GradeResult(task.lab, task.student_id, error=traceback.format_exc())
    result = replace(result, warnings=sandbox_warnings(task))
    Path(argv[1]).write_text(result.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
