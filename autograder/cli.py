"""`python -m autograder`: release labs, grade submissions, write feedback, export grades.

    python -m autograder release LAB [--check]
    python -m autograder grade LAB [SUBMISSIONS] [--runner cpu|gpu] [--student S]
    python -m autograder feedback LAB [--student S]
    python -m autograder export [--output grades.csv]

Every command takes --root (the repository: solutions/ and labs/; default this one) and
--course-dir (the nbgrader grading root; default ROOT/.grading).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.course import Course, CourseError, check_lab_name
from autograder.profiles import PROFILES, ProfileError, get_profile


def lab_name(text: str) -> str:
    """A lab by name or by folder: `lab1_cuda_kernels`, `solutions/lab1_cuda_kernels/`."""
    return check_lab_name(Path(text.rstrip("/")).name)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, help="repository with solutions/ and labs/")
    common.add_argument("--course-dir", type=Path, help="nbgrader grading root (ROOT/.grading)")

    parser = argparse.ArgumentParser(
        prog="python -m autograder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    release = sub.add_parser("release", parents=[common], help="labs/LAB from solutions/LAB")
    release.add_argument("lab", type=lab_name)
    release.add_argument(
        "--check",
        action="store_true",
        help="release into a temporary folder; exit 1 if labs/LAB differs",
    )

    grade = sub.add_parser("grade", parents=[common], help="autograde submissions of LAB")
    grade.add_argument("lab", type=lab_name)
    grade.add_argument(
        "submissions",
        nargs="?",
        type=Path,
        help="folder of <student>/<LAB>.ipynb or <student>/<LAB>/<LAB>.ipynb "
        "(default: the grading root's submitted/)",
    )
    grade.add_argument(
        "--runner",
        choices=sorted(PROFILES),
        default="cpu",
        help="runner profile: kernel environment and time limits (default cpu)",
    )
    grade.add_argument(
        "--student",
        action="append",
        dest="students",
        metavar="S",
        help="grade only this student (repeatable)",
    )

    feedback = sub.add_parser("feedback", parents=[common], help="HTML feedback for LAB")
    feedback.add_argument("lab", type=lab_name)
    feedback.add_argument("--student", metavar="S", help="only this student")

    export = sub.add_parser("export", parents=[common], help="grades CSV, one row per student/lab")
    export.add_argument("--output", type=Path, default=Path("grades.csv"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CourseError as exc:  # a bad LAB name, raised while parsing
        parser.error(str(exc))
    course = Course.at(args.root, args.course_dir)
    try:
        return COMMANDS[args.command](course, args)
    except (CourseError, ProfileError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _release(course: Course, args) -> int:
    from autograder.release import check_release, release

    if args.check:
        drift = check_release(course, args.lab)
        print(drift.summary())
        return 0 if drift.ok else 1
    for path in release(course, args.lab):
        print(f"released {path}")
    return 0


def _grade(course: Course, args) -> int:
    from autograder.grade import grade

    profile = get_profile(args.runner)
    results = grade(course, args.lab, args.submissions, profile, args.students)
    failed = [r.student_id for r in results if not r.ok]
    if failed:
        print(
            f"{len(failed)} of {len(results)} submissions got no grade: {', '.join(failed)}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _feedback(course: Course, args) -> int:
    from autograder.feedback import generate_feedback

    for path in generate_feedback(course, args.lab, args.student):
        print(f"feedback {path}")
    return 0


def _export(course: Course, args) -> int:
    from autograder.export import export

    table = export(course, args.output)
    print(f"wrote {len(table)} rows to {args.output}")
    return 0


COMMANDS = {"release": _release, "grade": _grade, "feedback": _feedback, "export": _export}
