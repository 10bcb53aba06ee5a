"""Grading a lab end to end, as an instructor does, and the checks every lab's grading must pass.

    graded = grade_batch(LAB4, MISTAKES, tmp)    # solution, untouched release, one per mistake
    expect_full_marks(graded, POINTS)
    expect_mistake_costs_its_part(graded, POINTS, mistake)

One batch per lab, graded with autograder's grade (cpu profile, two jobs) and generate_feedback,
so a module's tests read one result instead of grading again. A lab's own grading test adds
what is particular to it (hostile cases, processes left behind, the CLI).
Not a test module (no `test_` prefix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lab_submissions import ROOT, Lab, Mistake, error_of, grade_id, page_text, read

from autograder.course import Course
from autograder.feedback import generate_feedback
from autograder.grade import grade
from autograder.profiles import get_profile

STUB_HINT = "Replace `raise NotImplementedError()` with your code."


@dataclass(frozen=True)
class Graded:
    results: dict  # student -> the grader's result (scores, seconds, error)
    scores: dict  # student -> {test grade_id: points}
    tests: dict  # student -> {test grade_id: the autograded test cell}
    feedback: dict  # student -> (the HTML page, its text)


def grade_batch(lab: Lab, mistakes, tmp: Path, points: dict, extra=None, jobs: int = 2) -> Graded:
    """Hand in the solution, the untouched release and one submission per mistake (plus
    `extra(folder)`, which may hand in more), grade them in one batch and make the feedback."""
    subs = tmp / "submissions"
    lab.hand_in(subs, "solution", lab.solution())
    lab.hand_in(subs, "untouched", lab.released())
    for mistake in mistakes:
        lab.hand_in(subs, mistake.student_id, lab.with_mistake(mistake))
    if extra is not None:
        extra(subs)

    course = Course.at(ROOT, tmp / "grading")
    results = grade(course, lab.name, subs, get_profile("cpu"), progress=False, jobs=jobs)
    print("seconds per submission:", {r.student_id: round(r.seconds) for r in results})
    errors = {r.student_id: r.error for r in results if not r.ok}
    assert not errors, f"the grader failed on: {errors}"
    pages = generate_feedback(course, lab.name)

    scores, tests = {}, {}
    for result in results:
        scores[result.student_id] = {c.grade_id: c.auto_score for c in result.scores}
        nb = read(Path(result.autograded) / lab.notebook)
        tests[result.student_id] = {grade_id(c): c for c in nb.cells if grade_id(c) in points}
    feedback = {}
    for page in pages:
        student = page.relative_to(course.grading / "feedback").parts[0]
        source = page.read_text()
        feedback[student] = (source, page_text(source))
    return Graded({r.student_id: r for r in results}, scores, tests, feedback)


def expect_full_marks(graded: Graded, points: dict) -> None:
    assert graded.scores["solution"] == {test: float(p) for test, p in points.items()}
    assert not graded.results["solution"].flags, graded.results["solution"].flags


def expect_untouched_scores_zero(graded: Graded, points: dict) -> None:
    """The release as handed out scores 0, each test saying which stub to replace."""
    assert graded.scores["untouched"] == dict.fromkeys(points, 0.0)
    for test, cell in graded.tests["untouched"].items():
        error = error_of(cell)
        assert error.ename == "AssertionError", test
        assert "raised NotImplementedError" in error.evalue and STUB_HINT in error.evalue, test


def expect_mistake_costs_its_part(graded: Graded, points: dict, mistake: Mistake,
                                  also_fails: tuple = ()) -> None:
    """`mistake` costs its test's points (and those of `also_fails`, tests that grade the same
    function) and nothing else, failing with the checker's teaching message."""
    failing = {mistake.test, *also_fails}
    want = {test: 0.0 if test in failing else float(p) for test, p in points.items()}
    assert graded.scores[mistake.student_id] == want
    error = error_of(graded.tests[mistake.student_id][mistake.test])
    assert error.ename == "AssertionError"
    assert re.search(mistake.teaching, error.evalue, re.S), error.evalue


def expect_feedback_teaches(graded: Graded, mistake: Mistake) -> None:
    _, text = graded.feedback[mistake.student_id]
    assert re.search(mistake.teaching, text, re.S), f"{mistake.student_id}: no teaching"
    _, control = graded.feedback["solution"]  # the message comes from the failed test
    assert not re.search(mistake.teaching, control, re.S)


def expect_no_hidden_test_in_feedback(graded: Graded, lab: Lab, at_least: int) -> None:
    hidden = lab.hidden_test_lines()
    assert len(hidden) >= at_least, "the lab's hidden tests were not found"
    assert set(graded.feedback) == set(graded.scores)
    for student, (page, text) in graded.feedback.items():
        assert "HIDDEN TESTS" not in page, student
        for line in hidden:
            assert line not in text, f"{student}'s feedback shows the hidden test {line!r}"
