"""The quiz's numeric questions graded as their hidden tests grade them, for every draw of every
learner's numbers: the key passes; each known slip (gpulab/checks/quiz/slips.py: the forward
instead of the inverse, an off-by-one, a factor or a term left out) fails with the sentence that
names it; a number in another unit fails with the factor; a count one off fails. The unit, the
tolerance and the lesson section are read from the notebook's own test cells.
The expected answers themselves are tested in tests/test_quiz_variants.py.
"""

from __future__ import annotations

import ast
import math

import pytest
from lab_submissions import BEGIN_HIDDEN, ROOT, cell_by_grade_id, read
from test_quiz_variants import NUMERIC, every_draw

from gpulab.checks.quiz import grade_number
from gpulab.checks.quiz.expected import EXPECTED
from gpulab.checks.quiz.slips import SLIPS, known_slips
from gpulab.quiz import draw

pytestmark = pytest.mark.quiz

SOLUTION = ROOT / "solutions" / "quiz" / "quiz.ipynb"


def graded_as(question: str) -> dict:
    """The keyword arguments of the hidden grade_number call in `question`'s test cell (unit,
    rel, see; slips as the call names them)."""
    source = cell_by_grade_id(read(SOLUTION), question).source
    hidden = ast.parse(source[source.index(BEGIN_HIDDEN):])
    (call,) = [node for node in ast.walk(hidden) if isinstance(node, ast.Call)
               and getattr(node.func, "id", None) == "grade_number"]
    kwargs = {k.arg: k.value for k in call.keywords}
    assert ast.unparse(kwargs.pop("slips")) == f"known_slips({question!r}, mine.learner)"
    return {"rel": 0.01, **{name: ast.literal_eval(value) for name, value in kwargs.items()}}


def grade(question: str, number: float, numbers, how: dict) -> str | None:
    """The message grading `number` for `numbers` gives, or None when it passes."""
    try:
        grade_number(question, number, EXPECTED[question](numbers),
                     slips=SLIPS[question](numbers), **how)
    except AssertionError as error:
        return str(error)
    return None


def test_every_numeric_question_has_slips_and_a_section_to_revisit():
    assert list(SLIPS) == list(EXPECTED) == NUMERIC
    for question in NUMERIC:
        how = graded_as(question)
        assert how["see"].startswith("Lesson 0"), question
        assert how["rel"] in (0.0, 0.01), question


@pytest.mark.parametrize("question", NUMERIC)
def test_the_key_passes_and_each_slip_fails_with_its_sentence(question):
    how = graded_as(question)
    missed = dict.fromkeys(SLIPS[question](every_draw(question)[0]), 0)
    for numbers in every_draw(question):
        want = EXPECTED[question](numbers)
        assert grade(question, want, numbers, how) is None, numbers
        for sentence, values in SLIPS[question](numbers).items():
            for value in values:
                if math.isclose(value, want, rel_tol=max(how["rel"], 1e-6)):
                    continue  # for these numbers, that slip gives the answer
                message = grade(question, value, numbers, how)
                assert message is not None and sentence in message, (numbers, value, message)
                assert message.endswith(f"{how['see']} explains it."), message
                missed[sentence] += 1
    never = [sentence for sentence, times in missed.items() if not times]
    assert not never, f"{question}: these slips give the answer for every draw: {never}"


@pytest.mark.parametrize("question", NUMERIC)
def test_a_number_in_another_unit_or_a_count_one_off_fails(question):
    how = graded_as(question)
    for numbers in every_draw(question):
        want = EXPECTED[question](numbers)
        message = grade(question, want * 1e3, numbers, how)
        assert message is not None and "off by a factor of 1e3" in message, (numbers, message)
        if how["rel"] == 0.0:  # a count
            for off_by_one in (want - 1, want + 1):
                assert grade(question, off_by_one, numbers, how) is not None, numbers


def test_a_wrong_number_with_no_known_slip_says_what_to_revisit():
    numbers = draw("ada").q13
    how = graded_as("q13")
    message = grade("q13", 1.37 * EXPECTED["q13"](numbers), numbers, how)
    assert message.startswith("q13 = ") and message.endswith(f"Revisit {how['see']}.")


def test_the_slips_are_the_learners_own():
    """known_slips draws the numbers from the id, as the grader's key does."""
    assert known_slips("q19", "ada") == SLIPS["q19"](draw("ada").q19)
    assert known_slips("q19", "ada") != known_slips("q19", "grace")
