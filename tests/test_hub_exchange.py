"""Deadlines and resubmission through nbgrader's exchange, as a hub's class hands in, with no
hub or browser: the fixture lab published with a deadline, learners who fetch and submit with
nbgrader's own exchange steps (as their Assignments tab does), collect, grade, feedback.

    ada  hands in three times: 2 points early, 5 points just before the deadline, and a broken
         notebook after it. The latest before the deadline is graded (5), not flagged late.
    bea  hands in once, 30 minutes late: graded (5), flagged "late by 0h30m".
    cy   hands in (2 points), is graded, then hands in again before the deadline (5): the next
         collect takes the resubmission and grade grades it again; every submission of all
         three stays in the exchange.

Then `feedback --exchange` and each learner's fetch of their feedback: their own score, no
hidden test. About 30 s on 2 cores (four gradings, one nbgrader kernel each).
"""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat
import pytest
from hostile.cases import FIXTURE_HIDDEN

from autograder.cli import main
from autograder.course import COURSE_ID, Course
from autograder.exchange import exchange_config, exchange_step

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"
DUE = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
MEAN = "def mean(xs):\n    return sum(xs) / len(xs)"
RUNNING_MAX = ("def running_max(xs):\n    out, best = [], xs[0]\n    for x in xs:\n"
               "        best = max(best, x)\n        out.append(best)\n    return out")
HALF_DONE = {"mean": MEAN}  # 2 of 5 points: running_max left as released
ALL_DONE = {"mean": MEAN, "running_max": RUNNING_MAX}
BROKEN = {"mean": "def mean(xs):\n    return 0"}


def run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    assert code == 0, f"python -m autograder {' '.join(argv)} exited {code}:\n{out.getvalue()}"
    return out.getvalue()


class Learner:
    """One learner's side of the exchange: nbgrader's fetch, submit and fetch-feedback steps,
    under the learner's name, in a home of their own, at a chosen time."""

    def __init__(self, name: str, home: Path, exchange: Path):
        self.name, self.home, self.exchange = name, home, exchange
        home.mkdir(parents=True)

    def step(self, step_class, monkeypatch, when: datetime | None = None):
        import nbgrader.exchange.default.fetch_feedback as fetch_feedback
        import nbgrader.exchange.default.submit as submit

        for module in (submit, fetch_feedback):  # nbgrader asks the OS; a hub user is one
            monkeypatch.setattr(module, "get_username", lambda: self.name)
        config = exchange_config(self.home, LAB, self.exchange)
        config.Exchange.assignment_dir = str(self.home)
        config.Exchange.cache = str(self.home / "cache")
        step = exchange_step(step_class, config)
        if when is not None:
            step.set_timestamp = lambda: setattr(
                step, "timestamp", when.strftime(step.timestamp_format))
        step.start()

    def hand_in(self, answers: dict[str, str], when: datetime, monkeypatch) -> None:
        from nbgrader.exchange.default import ExchangeFetchAssignment, ExchangeSubmit

        notebook = self.home / LAB / NOTEBOOK
        if not notebook.exists():
            self.step(ExchangeFetchAssignment, monkeypatch)
        nb = nbformat.read(notebook, as_version=4)
        for cell in nb.cells:
            if cell.get("id") in answers:
                cell.source = answers[cell.id]
        nbformat.write(nb, notebook)
        self.step(ExchangeSubmit, monkeypatch, when)

    def feedback(self, monkeypatch) -> list[str]:
        from nbgrader.exchange.default import ExchangeFetchFeedback

        self.step(ExchangeFetchFeedback, monkeypatch)
        return [page.read_text() for page in sorted((self.home / LAB / "feedback").rglob("*.html"))]


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> tuple[Course, Path]:
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    run("release", LAB, "--root", str(root))
    exchange = root / "exchange"
    exchange.mkdir()
    run("publish", LAB, "--root", str(root), "--exchange", str(exchange),
        "--due", DUE.isoformat())
    return Course.at(root), exchange


def grades(course: Course) -> dict[str, tuple[str, str]]:
    out = course.grading / "grades.csv"
    run("export", "--root", str(course.labs.parent), "--output", str(out))
    return {row["student_id"]: (row["score"], row["flags"])
            for row in csv.DictReader(out.open())}


def grade(course: Course) -> None:
    run("grade", LAB, "--root", str(course.labs.parent))


def test_the_latest_submission_before_the_deadline_is_graded_a_late_one_flagged_and_a_resubmission_graded_again(  # noqa: E501
        course, tmp_path, monkeypatch):
    course, exchange = course
    ada, bea, cy = (Learner(name, tmp_path / name, exchange) for name in ("ada", "bea", "cy"))
    ada.hand_in(HALF_DONE, DUE - timedelta(hours=2), monkeypatch)
    ada.hand_in(ALL_DONE, DUE - timedelta(minutes=1), monkeypatch)
    ada.hand_in(BROKEN, DUE + timedelta(hours=1), monkeypatch)
    bea.hand_in(ALL_DONE, DUE + timedelta(minutes=30), monkeypatch)
    cy.hand_in(HALF_DONE, DUE - timedelta(hours=3), monkeypatch)
    root = str(course.labs.parent)

    assert "collected 3 new submissions" in run("collect", LAB, "--root", root,
                                                "--exchange", str(exchange))
    grade(course)
    assert grades(course) == {"ada": ("5", ""), "bea": ("5", "late by 0h30m"), "cy": ("2", "")}

    cy.hand_in(ALL_DONE, DUE - timedelta(hours=1), monkeypatch)
    assert run("collect", LAB, "--root", root, "--exchange", str(exchange)).strip().endswith(
        "collected 1 new submissions of lab0_fixture: cy")
    grade(course)
    assert grades(course) == {"ada": ("5", ""), "bea": ("5", "late by 0h30m"), "cy": ("5", "")}
    inbound = [path.name.split("+")[0] for path in (exchange / COURSE_ID / "inbound").iterdir()]
    assert sorted(inbound) == ["ada", "ada", "ada", "bea", "cy", "cy"]  # nothing lost

    assert "feedback of 3 learners in the exchange" in run(
        "feedback", LAB, "--root", root, "--exchange", str(exchange))
    for learner in (ada, bea, cy):
        pages = learner.feedback(monkeypatch)
        assert pages, f"{learner.name} fetched no feedback"
        # Feedback of the graded submission only: cy's resubmission, not her first.
        assert len(pages) == 1, f"{learner.name} fetched {len(pages)} pages"
        assert "5.0 / 5.0" in pages[0], pages[0][:2000]
        assert not [marker for marker in FIXTURE_HIDDEN if marker in pages[0]]
