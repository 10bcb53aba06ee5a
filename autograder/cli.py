"""`python -m autograder`: release labs, grade submissions, write feedback, export grades.

    python -m autograder release LAB [--check]
    python -m autograder grade LAB [SUBMISSIONS] [--runner cpu|gpu] [--student S]
                               [--jobs N] [--shard I/N] [--regrade] [--no-sandbox]
    python -m autograder feedback LAB [--student S] [--exchange DIR]
    python -m autograder export [--output grades.csv]
    python -m autograder merge GRADING_ROOT... --into DIR
    python -m autograder publish LAB --exchange DIR [--due 2026-12-01T23:59Z]
    python -m autograder collect LAB --exchange DIR

Every command but merge takes --root (the repository: solutions/ and labs/; default this one)
and --course-dir (the nbgrader grading root; default ROOT/.grading).

`grade` can be stopped at any time (Ctrl-C, or killed): running the same command again
finishes the batch, skipping what was already graded. `--shard i/n` on n runners, then `merge`
of their grading roots, grades a class on several machines. On a JupyterHub, nbgrader's
exchange (--exchange) carries labs out (publish), submissions in (collect, then grade without
SUBMISSIONS) and feedback back (feedback --exchange).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from autograder.course import Course, CourseError, check_lab_name
from autograder.profiles import PROFILES, ProfileError, get_profile
from autograder.shards import Shard

INTERRUPTED = 130  # the shell's exit status for a command stopped by Ctrl-C


def lab_name(text: str) -> str:
    """A lab by name or by folder: `lab1_cuda_kernels`, `solutions/lab1_cuda_kernels/`."""
    return check_lab_name(Path(text.rstrip("/")).name)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except CourseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def due_date(text: str):
    from autograder.exchange import parse_due

    try:
        return parse_due(text)
    except CourseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        "--cell-timeout",
        type=positive_int,
        metavar="S",
        help="stop a cell after S seconds instead of the profile's limit (cpu 180, gpu 60): "
        "more on a shared or busy runner, where a heavy cell can take several times as long",
    )
    grade.add_argument(
        "--student",
        action="append",
        dest="students",
        metavar="S",
        help="grade only this student (repeatable)",
    )
    grade.add_argument(
        "--jobs",
        "-j",
        type=positive_int,
        default=1,
        metavar="N",
        help="grade N submissions at a time, one worker process each (default 1); about one "
        "per CPU core on the cpu runner",
    )
    grade.add_argument(
        "--shard",
        type=shard,
        metavar="I/N",
        help="grade only shard I of N (1 <= I <= N), chosen by a stable hash of the student "
        "id: run the N shards on N machines, each into its own --course-dir, then `merge`",
    )
    grade.add_argument(
        "--regrade",
        action="store_true",
        help="grade again submissions already graded; by default a submission whose notebooks, "
        "lab source and runner profile are unchanged since it was recorded keeps its grade",
    )
    grade.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run learners' code without the sandbox (autograder/sandbox.py): as this user, "
        "seeing the solutions, the gradebook and the network, with no resource limits. Only "
        "for code you trust",
    )

    feedback = sub.add_parser("feedback", parents=[common], help="HTML feedback for LAB")
    feedback.add_argument("lab", type=lab_name)
    feedback.add_argument("--student", metavar="S", help="only this student")
    feedback.add_argument("--exchange", type=Path, metavar="DIR",
                          help="also put the pages into nbgrader's exchange DIR, where each "
                          "learner fetches their own from the Assignments tab")

    publish = sub.add_parser("publish", parents=[common],
                             help="labs/LAB into nbgrader's exchange, for learners to fetch")
    publish.add_argument("lab", type=lab_name)
    publish.add_argument("--exchange", type=Path, required=True, metavar="DIR",
                         help="nbgrader's exchange folder, shared by the hub's users")
    publish.add_argument("--due", type=due_date, metavar="WHEN",
                         help="the deadline, ISO 8601 (UTC unless it names a zone): collect "
                         "takes the latest submission before it, and export flags a late one")

    collect = sub.add_parser("collect", parents=[common],
                             help="learners' latest submissions of LAB from the exchange")
    collect.add_argument("lab", type=lab_name)
    collect.add_argument("--exchange", type=Path, required=True, metavar="DIR",
                         help="nbgrader's exchange folder, shared by the hub's users")

    export = sub.add_parser("export", parents=[common], help="grades CSV, one row per student/lab")
    export.add_argument("--output", type=Path, default=Path("grades.csv"))

    merge = sub.add_parser(
        "merge",
        help="merge grading roots (shards) into one",
        description="Merge the grading roots of shards (`grade --shard i/n --course-dir ...`) "
        "into one new grading root, for `feedback` and `export --course-dir DIR`. A submission "
        "graded in several roots must have the same grades in each (the first root named "
        "wins); otherwise nothing is merged.",
    )
    merge.add_argument(
        "roots",
        nargs="+",
        type=Path,
        metavar="GRADING_ROOT",
        help="a grading root to merge: each shard's --course-dir",
    )
    merge.add_argument(
        "--into",
        type=Path,
        required=True,
        metavar="DIR",
        help="the merged grading root: a new or empty folder",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CourseError as exc:  # a bad LAB name, raised while parsing
        parser.error(str(exc))
    course = Course.at(getattr(args, "root", None), getattr(args, "course_dir", None))
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
    from autograder.sandbox import confinement

    profile = get_profile(args.runner)
    if args.no_sandbox:
        profile = replace(profile, sandboxed=False)
    if args.cell_timeout:
        profile = replace(profile, cell_timeout_s=args.cell_timeout)
    for weakness in confinement().weaknesses(profile.sandbox_settings()):
        print(f"WARNING, weaker sandbox: {weakness}", file=sys.stderr)
    try:
        results = grade(
            course,
            args.lab,
            args.submissions,
            profile,
            args.students,
            jobs=args.jobs,
            shard=args.shard,
            regrade=args.regrade,
        )
    except KeyboardInterrupt:
        print(
            "interrupted: what was graded is recorded; run the same command again to finish",
            file=sys.stderr,
        )
        return INTERRUPTED
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
    if args.exchange:
        from autograder.exchange import return_feedback

        returned = return_feedback(course, args.lab, args.exchange)
        print(f"feedback of {len(returned)} learners in the exchange: {', '.join(returned)}")
    return 0


def _publish(course: Course, args) -> int:
    from autograder.exchange import publish

    folder = publish(course, args.lab, args.exchange, args.due)
    due = f", due {args.due:%Y-%m-%d %H:%M} UTC" if args.due else ""
    print(f"published {folder}{due}")
    return 0


def _collect(course: Course, args) -> int:
    from autograder.exchange import collect

    changed = collect(course, args.lab, args.exchange)
    print(f"collected {len(changed)} new submissions of {args.lab}"
          + (f": {', '.join(changed)}" if changed else ""))
    return 0


def _export(course: Course, args) -> int:
    from autograder.export import export

    table = export(course, args.output)
    print(f"wrote {len(table)} rows to {args.output}")
    return 0


def _merge(course: Course, args) -> int:
    from autograder.shards import merge

    merged = merge(args.roots, args.into)
    students = {student_id for _, student_id in merged}
    print(f"merged {len(merged)} graded submissions of {len(students)} students into {args.into}")
    return 0


COMMANDS = {
    "release": _release,
    "grade": _grade,
    "feedback": _feedback,
    "export": _export,
    "merge": _merge,
    "publish": _publish,
    "collect": _collect,
}
