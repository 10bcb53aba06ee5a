"""nbgrader's exchange: the shared folder through which a class on one JupyterHub hands labs out,
hands them in and gets feedback back (`publish`, `collect`, `feedback --exchange`).

    publish LAB           labs/LAB (the committed release) into the exchange's outbound/, where
                          every learner's Assignments tab lists it; with --due, the deadline is
                          recorded in the grading root's gradebook
    collect LAB           each learner's latest submission from inbound/ into the grading root's
                          submitted/, as nbgrader collects it: with a deadline, the latest one
                          handed in before it (a learner with only late ones: the latest late
                          one, which `export` then flags); a newer resubmission replaces the
                          collected one, and every submission stays in inbound/: nothing handed
                          in is lost
    feedback LAB --exchange   the feedback pages into the exchange, where each learner's
                          Assignments tab fetches their own: nbgrader names each page by a hash
                          of the secret that only that learner's submission holds

nbgrader's own exchange classes do the work, with their configuration built in code (as
autograder/course.py does for the converters), so no nbgrader_config.py on the machine changes
where a class's files go.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from autograder.course import COURSE_ID, Course, CourseError, nbgrader_config, prepare_nbgrader

# What nbgrader's submit leaves beside a learner's notebooks, and its release_feedback reads
# beside each feedback page: when it was handed in, and the secret that names the page.
SUBMISSION_FILES = ("timestamp.txt", "submission_secret.txt")


def run_exchange(step_class, config) -> None:
    """Run one of nbgrader's exchange steps; its failure becomes a CourseError saying why."""
    from nbgrader.exchange import ExchangeError

    prepare_nbgrader()
    step = exchange_step(step_class, config)
    try:
        step.start()
    except ExchangeError as exc:
        raise CourseError(f"nbgrader's exchange ({step_class.__name__}): {exc}") from exc


def exchange_step(step_class, config):
    """One of nbgrader's exchange steps, configured by `config` alone."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    return step_class(coursedir=CourseDirectory(config=config),
                      authenticator=Authenticator(config=config), config=config)


def exchange_config(root: Path, lab: str, exchange: Path, student_id: str = "*", **extra):
    config = nbgrader_config(root, lab, student_id, **extra)
    config.Exchange.root = str(Path(exchange).resolve())
    return config


def publish(course: Course, lab: str, exchange: Path, due: datetime | None = None) -> Path:
    """Copy labs/LAB into the exchange; return its folder there."""
    from nbgrader.api import Gradebook
    from nbgrader.exchange.default import ExchangeReleaseAssignment

    released = course.labs / lab
    if not any(released.glob("*.ipynb")):
        raise CourseError(f"no released notebook in {released}: run "
                          f"`python -m autograder release {lab}` first.")
    # The exchange step reads ROOT/release_directory/LAB: here, the committed labs/LAB.
    config = exchange_config(course.labs.parent, lab, exchange, **{
        "CourseDirectory.release_directory": course.labs.name,
        "ExchangeReleaseAssignment.force": True})
    run_exchange(ExchangeReleaseAssignment, config)
    if due is not None:
        prepare_nbgrader()
        course.grading.mkdir(parents=True, exist_ok=True)
        with Gradebook(course.gradebook_url, COURSE_ID) as gradebook:
            gradebook.update_or_create_assignment(lab, duedate=due)
    return Path(exchange) / COURSE_ID / "outbound" / lab


def collect(course: Course, lab: str, exchange: Path) -> list[str]:
    """Each learner's submission to grade, from the exchange into submitted/; returns the ids
    of the learners whose collected submission is new or changed."""
    from nbgrader.exchange.default import ExchangeCollect

    before = _collected(course, lab)
    config = exchange_config(course.grading, lab, exchange, **{
        "ExchangeCollect.update": True,
        "ExchangeCollect.before_duedate": True,
        # Every file in a shared exchange belongs to the hub's users; root may collect.
        "ExchangeCollect.check_owner": False})
    run_exchange(ExchangeCollect, config)
    after = _collected(course, lab)
    return sorted(student for student, stamp in after.items() if before.get(student) != stamp)


def _collected(course: Course, lab: str) -> dict[str, str]:
    """student id -> the timestamp of their collected submission of `lab`."""
    stamps = sorted((course.grading / "submitted").glob(f"*/{lab}/timestamp.txt"))
    return {path.parent.parent.name: path.read_text().strip() for path in stamps}


def return_feedback(course: Course, lab: str, exchange: Path) -> list[str]:
    """Put every feedback page of `lab` into the exchange; returns the learners' ids."""
    from nbgrader.exchange.default import ExchangeReleaseFeedback

    pages = sorted((course.grading / "feedback").glob(f"*/{lab}"))
    if not pages:
        raise CourseError(f"no feedback for {lab} in {course.grading}: run "
                          f"`python -m autograder feedback {lab}` first.")
    students = []
    for folder in pages:
        student = folder.parent.name
        handed_in = course.grading / "submitted" / student / lab
        if not all((handed_in / name).is_file() for name in SUBMISSION_FILES):
            print(f"skipped {student}: not handed in through the exchange (no "
                  f"{' or '.join(SUBMISSION_FILES)} in {handed_in})")
            continue
        for name in SUBMISSION_FILES:  # feedback of the submission that was graded
            shutil.copyfile(handed_in / name, folder / name)
        # One learner at a time: nbgrader's step stops at the first page it cannot name.
        run_exchange(ExchangeReleaseFeedback,
                     exchange_config(course.grading, lab, exchange, student_id=student))
        students.append(student)
    return students


def parse_due(text: str) -> datetime:
    """An ISO 8601 deadline ("2026-12-01T23:59+01:00"); one without a zone is UTC."""
    try:
        due = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CourseError(f"{text!r} is not a date and time (e.g. 2026-12-01T23:59Z)") from exc
    if due.tzinfo is None:
        due = due.replace(tzinfo=UTC)
    # nbgrader's gradebook stores naive UTC.
    return due.astimezone(UTC).replace(tzinfo=None)
