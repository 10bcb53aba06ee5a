"""gpulab.quiz, headless: the multiple-choice buttons (with and without ipywidgets), the checks the
quiz's test cells call, and the quiz notebook itself run in this process (no kernel): the
solution passes every test for any learner, the release fails each with the stub's hint and
shows no answer, one learner's answers written down as numbers fail another's tests, and no
strategy blind to the questions (the longest option, one letter) passes the quiz.
Each learner's numbers (gpulab/quiz/variant.py) are tested in tests/test_quiz_variants.py;
grading end to end, through nbgrader, in tests/test_grading_quiz.py.
"""

from __future__ import annotations

import ast
import re
import sys

import numpy as np
import pytest
from grading_specs import QUIZ as SPEC
from grading_specs import QUIZ_NUMERIC, numbers_written_down
from lab_submissions import BEGIN_HIDDEN, END_HIDDEN, ROOT, cell_by_grade_id, grade_id, read

from gpulab.checks.quiz import (
    ASSIGNMENT,
    CHOICE,
    check_number,
    check_pick,
    grade_number,
    grade_pick,
)
from gpulab.quiz import LearnerError, Pick, choose
from gpulab.quiz.variant import HUB_USER
from gpulab.stubs import STUB_HINT

pytestmark = pytest.mark.quiz

OPTIONS = {"a": "reduce, then scatter", "b": "reduce-scatter, then all-gather",
           "c": "all-to-all, then reduce"}
SOLUTION = ROOT / "solutions" / "quiz" / "quiz.ipynb"
RELEASE = ROOT / "labs" / "quiz" / "quiz.ipynb"
QUESTIONS = [f"q{i:02d}" for i in range(1, 26)]


# ----------------------------------------------------------------------------- the buttons


def test_a_click_stores_the_pick_and_shows_the_line_to_write():
    namespace = {}
    picker = choose("q13", OPTIONS, namespace, interactive=True)
    box = picker.widget()
    radio, status = box.children
    assert [label for label, _ in radio.options] == [f"{k}) {v}" for k, v in OPTIONS.items()]
    assert radio.value is None and picker.value is None and "q13" not in namespace
    assert "Click a choice" in status.value

    radio.value = "b"  # what a click does in the browser
    assert namespace["q13"] == "b" and isinstance(namespace["q13"], Pick)
    assert picker.line == 'q13 = "b"'
    assert "<code>q13 = &quot;b&quot;</code>" in status.value
    assert "(*) b) reduce-scatter, then all-gather" in picker.text()
    assert "( ) a) reduce, then scatter" in picker.text()


def test_a_pick_from_code_moves_the_buttons():
    namespace = {}
    picker = choose("q13", OPTIONS, namespace, interactive=True)
    radio, _ = picker.widget().children
    assert picker.pick("c") == 'q13 = "c"'
    assert radio.value == "c" and namespace["q13"] == "c"


def test_the_buttons_start_from_what_the_answer_cell_says():
    namespace = {"q13": "b"}  # the answer cell ran before the buttons were shown again
    picker = choose("q13", OPTIONS, namespace, interactive=True)
    radio, status = picker.widget().children
    assert radio.value == "b" and picker.value == "b"
    assert type(namespace["q13"]) is str  # showing the buttons stores nothing
    assert 'q13 = &quot;b&quot;' in status.value


def test_the_notebook_shows_the_widget_and_its_text():
    picker = choose("q13", OPTIONS, {}, interactive=True)
    bundle = picker._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == picker.text()


def test_without_ipywidgets_the_choices_are_plain_text(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` now fails
    namespace = {}
    picker = choose("q13", OPTIONS, namespace, interactive=True)
    assert not picker.interactive
    assert picker._repr_mimebundle_() == {"text/plain": picker.text()}
    assert picker.text().splitlines() == [
        "q13:", "  ( ) a) reduce, then scatter", "  ( ) b) reduce-scatter, then all-gather",
        "  ( ) c) all-to-all, then reduce",
        "Click a choice to see the line to write in the answer cell below."]
    assert picker.pick("a") == 'q13 = "a"' and namespace["q13"] == "a"
    assert "(*) a)" in repr(picker)


def test_outside_a_kernel_it_shows_text_and_keeps_the_pick_to_itself():
    picker = choose("q13", OPTIONS)  # plain Python: no notebook namespace, nothing to draw
    assert not picker.interactive and picker.namespace is None
    assert picker.pick("b") == 'q13 = "b"' and picker.value == "b"


@pytest.mark.parametrize("name, options, error", [
    ("q 13", OPTIONS, "not a Python variable name"),
    ("q13", {"a": "only one"}, "two or more lower-case letters"),
    ("q13", {"A": "x", "B": "y"}, "two or more lower-case letters"),
    ("q13", {"ab": "x", "c": "y"}, "two or more lower-case letters"),
])
def test_bad_questions_are_refused(name, options, error):
    with pytest.raises(ValueError, match=error):
        choose(name, options, {})


def test_a_letter_not_offered_cannot_be_picked():
    with pytest.raises(ValueError, match="'d' is not one of the choices a, b, c"):
        choose("q13", OPTIONS, {}).pick("d")


# ----------------------------------------------------------------------------- the checks


def test_check_pick_accepts_a_written_letter_in_any_case():
    check_pick("q13", "b")
    check_pick("q13", " B ")


@pytest.mark.parametrize("value, message", [
    (None, re.escape(STUB_HINT)),
    (Pick("b"), r'You clicked "b" for q13, but the answer cell does not say so yet.*write '
                r'q13 = "b" in the answer cell'),
    (2, r'q13 must be a letter in quotes, q13 = "<your letter>", not a int'),
    ("e", r"q13 = 'e' is not one of the choices: write one of the letters a, b, c, d"),
    ("b)", r"is not one of the choices"),
])
def test_check_pick_says_what_is_wrong_with_the_form(value, message):
    with pytest.raises(AssertionError, match=message):
        check_pick("q13", value)


def test_the_unanswered_message_says_which_stub_to_replace():
    with pytest.raises(AssertionError) as caught:
        check_pick("q13", None)
    assert "raised NotImplementedError" in str(caught.value)
    assert STUB_HINT in str(caught.value)


def test_grade_pick_never_gives_the_answer_away():
    grade_pick("q13", "d", "d")
    grade_pick("q13", "D", "d")
    with pytest.raises(AssertionError) as caught:
        grade_pick("q13", "b", "d", see="Lesson 04, section 4")
    assert str(caught.value) == 'q13: "b" is not the best choice. Lesson 04, section 4 explains it.'
    assert '"d"' not in str(caught.value)


def test_grade_pick_reads_the_text_of_a_str_that_claims_to_equal_everything():
    class EqualsAll(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

        def strip(self, *args):
            return self

        def lower(self):
            return EqualsAll("d")

    with pytest.raises(AssertionError, match='"b" is not the best choice'):
        grade_pick("q13", EqualsAll("b"), "d")


def test_grade_pick_refuses_an_object_that_equals_everything():
    class Anything:
        def __eq__(self, other):
            return True

    with pytest.raises(AssertionError, match="must be a letter in quotes"):
        grade_pick("q13", Anything(), "d")


@pytest.mark.parametrize("value", [17.5, 17, np.float64(17.5), np.int64(3), np.float32(0.5)])
def test_check_number_accepts_plain_and_numpy_numbers(value):
    check_number("q12", value, unit="milliseconds")


@pytest.mark.parametrize("value, message", [
    (None, re.escape(STUB_HINT)),
    (True, r"q12 must be a number in milliseconds \(such as q12 = 12.5\), not True/False"),
    ("17.5 ms", r"not a str\. Give the number alone"),
    (float("nan"), r"q12 is nan: the answer is a finite number"),
    (float("inf"), r"q12 is inf"),
])
def test_check_number_says_what_is_wrong_with_the_form(value, message):
    with pytest.raises(AssertionError, match=message):
        check_number("q12", value, unit="milliseconds")


def test_check_number_holds_a_fraction_to_its_range():
    check_number("q20", 0.23, unit="a fraction", low=0, high=1)
    with pytest.raises(AssertionError, match=r"q20 = 22.6 is outside \[0, 1\]"):
        check_number("q20", 22.6, unit="a fraction", low=0, high=1)


def test_grade_number_takes_a_relative_tolerance():
    grade_number("q12", 17.6, 17.57, unit="milliseconds")  # 0.2% off
    with pytest.raises(AssertionError) as caught:
        grade_number("q12", 19.5, 17.57, unit="milliseconds")
    assert str(caught.value) == "q12 = 19.5 milliseconds is not within 1% of the answer."
    assert "17.57" not in str(caught.value)


@pytest.mark.parametrize("got, factor", [
    (17.57e-3, "1e3"), (17570.0, "1e3"), (17.57e6, "1e6"), (1757.0, r"100 \(a percentage\?\)"),
])
def test_grade_number_says_when_only_the_unit_is_wrong(got, factor):
    with pytest.raises(AssertionError, match=f"off by a factor of {factor}: check that it is in "
                                             "milliseconds"):
        grade_number("q12", got, 17.57, unit="milliseconds")


def test_grade_number_names_hours_for_minutes_only_in_minutes():
    with pytest.raises(AssertionError, match=r"off by a factor of 60 \(hours or seconds against "
                                             r"minutes\)"):
        grade_number("q03", 1.5, 90.0, unit="minutes")
    with pytest.raises(AssertionError) as caught:
        grade_number("q12", 1.5, 90.0, unit="milliseconds")
    assert "factor" not in str(caught.value)


def test_grade_number_names_gib_for_gb_only_for_bytes():
    with pytest.raises(AssertionError, match=r"factor of 2\*\*30 / 1e9 \(Gi or Mi against G"):
        grade_number("q16", 37.375e9 / 2**30, 37.375, unit="GB")
    with pytest.raises(AssertionError) as caught:  # 7% off in another unit is just wrong
        grade_number("q12", 17.57 * 2**30 / 1e9, 17.57, unit="milliseconds")
    assert "factor" not in str(caught.value)


def test_grade_number_counts_exactly_when_asked():
    grade_number("q05", 192, 192, unit="threads", rel=0.0)
    grade_number("q05", 192.0, 192, unit="threads", rel=0.0)
    with pytest.raises(AssertionError, match="q05 = 193 threads is not exactly the answer"):
        grade_number("q05", 193, 192, unit="threads", rel=0.0)


SLIPS = {"That leaves out the latency term.": (21.0,),
         "That is the buffer over the time.": (12.0, 11.0)}


def test_grade_number_names_a_known_slip_and_where_the_formula_is_taught():
    with pytest.raises(AssertionError) as caught:
        grade_number("q13", 11.0, 17.57, unit="GB/s", slips=SLIPS, see="Lesson 04, section 6")
    assert str(caught.value) == ("q13 = 11 GB/s is not within 1% of the answer. That is the "
                                 "buffer over the time. Lesson 04, section 6 explains it.")
    assert "17.57" not in str(caught.value)


def test_grade_number_without_a_known_slip_says_what_to_revisit():
    with pytest.raises(AssertionError) as caught:
        grade_number("q13", 30.0, 17.57, unit="GB/s", slips=SLIPS, see="Lesson 04, section 6")
    assert str(caught.value) == ("q13 = 30 GB/s is not within 1% of the answer. Revisit "
                                 "Lesson 04, section 6.")


def test_grade_number_names_every_slip_a_number_matches():
    both = {**SLIPS, "That counts the reduce-scatter only.": (11.05,)}
    with pytest.raises(AssertionError, match=r"answer\. That is the buffer over the time\. Or: "
                                             r"That counts the reduce-scatter only\.$"):
        grade_number("q13", 11.0, 17.57, unit="GB/s", slips=both)


def test_grade_number_names_no_slip_that_gives_the_answer():
    """A slip equal to the answer for this learner's numbers is no mistake: a number near both
    is wrong for its own reason."""
    with pytest.raises(AssertionError) as caught:
        grade_number("q13", 21.3, 21.0, unit="GB/s", rel=0.01, slips=SLIPS)
    assert "latency" not in str(caught.value)
    grade_number("q13", 21.1, 21.0, unit="GB/s", slips=SLIPS)  # right is right


def test_grade_number_says_the_unit_slip_then_where_it_is_taught():
    with pytest.raises(AssertionError, match=r"off by a factor of 1e9: check that it is in GB/s, "
                                             r"as the question asks\. Lesson 04, section 6 "
                                             r"explains it\.$"):
        grade_number("q13", 17.57e9, 17.57, unit="GB/s", slips=SLIPS, see="Lesson 04, section 6")


def test_grade_number_matches_a_slip_in_a_count_exactly():
    slips = {"That is the largest count still memory-bound.": (429,)}
    with pytest.raises(AssertionError, match="exactly the answer. That is the largest count"):
        grade_number("q02", 429, 430, unit="tokens", rel=0.0, slips=slips)
    with pytest.raises(AssertionError) as caught:
        grade_number("q02", 428, 430, unit="tokens", rel=0.0, slips=slips)
    assert "largest count" not in str(caught.value)


def test_grade_number_reads_the_value_of_a_float_that_lies_about_itself():
    class Liar(float):
        def __float__(self):
            return 17.57

        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    with pytest.raises(AssertionError, match="q12 = 3 milliseconds"):
        grade_number("q12", Liar(3.0), 17.57, unit="milliseconds")


# ----------------------------------------------------------------------------- the notebook


def _run_in_process(nb) -> dict:
    """Run a quiz notebook's code cells in one namespace, as the grader runs them in a kernel,
    carrying on past errors; returns {test grade_id: its AssertionError, or None}."""
    from IPython.core.inputtransformer2 import TransformerManager

    namespace, outcomes = {}, {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})  # none on the LEARNER cell, a plain one
        name = meta.get("grade_id") or cell.id
        source = TransformerManager().transform_cell(cell.source)  # the setup cell's %pip
        try:
            exec(compile(source, name, "exec"), namespace)
            error = None
        except (AssertionError, NotImplementedError) as exc:
            error = exc
        if meta.get("grade"):
            outcomes[name] = error
    return outcomes


@pytest.fixture
def signed_in(monkeypatch):
    """signed_in("ada"): run notebooks as JupyterHub's user ada, whose LEARNER may stay empty."""
    return lambda learner: monkeypatch.setenv(HUB_USER, learner)


@pytest.mark.parametrize("learner", ["ada", "grace"])
def test_the_solution_passes_every_test_hidden_ones_included(learner, signed_in):
    """For any learner: its answer cells compute from that learner's numbers."""
    signed_in(learner)
    outcomes = _run_in_process(read(SOLUTION))
    assert list(outcomes) == QUESTIONS
    failed = {test: str(error) for test, error in outcomes.items() if error is not None}
    assert not failed


def test_the_release_fails_every_test_with_the_stub_hint(signed_in):
    signed_in("ada")
    outcomes = _run_in_process(read(RELEASE))
    assert list(outcomes) == QUESTIONS
    for test, error in outcomes.items():
        assert isinstance(error, AssertionError), test
        assert f"{test} is still None" in str(error) and STUB_HINT in str(error), test


def test_the_release_asks_whose_quiz_it_is_before_any_question(monkeypatch):
    """LEARNER left empty, and no JupyterHub: the cell that draws the numbers says what to do."""
    monkeypatch.delenv(HUB_USER, raising=False)
    with pytest.raises(LearnerError, match=r'Write your student id in the cell above, LEARNER = '
                                           r'"<your id>", exactly as the course knows you'):
        _run_in_process(read(RELEASE))


def test_numbers_written_down_pass_their_learners_tests_and_fail_anothers(signed_in):
    """ada's answers as numbers: right for ada; for grace every numeric question fails, and only
    those (the multiple-choice answers are the same for everyone)."""
    sheet = numbers_written_down("ada")
    signed_in("ada")
    assert not [test for test, error in _run_in_process(sheet).items() if error is not None]
    signed_in("grace")
    failed = {test: str(error) for test, error in _run_in_process(sheet).items()
              if error is not None}
    assert sorted(failed) == sorted(QUIZ_NUMERIC)
    assert all(re.search(r"is not (within 1% of|exactly) the answer", why)
               for why in failed.values()), failed


def _hidden_region(source: str) -> str:
    start, end = source.index(BEGIN_HIDDEN), source.index(END_HIDDEN)
    return source[start:end]


def test_every_question_is_graded_by_a_hidden_test_and_the_release_has_none():
    solution, release = read(SOLUTION), read(RELEASE)
    tests = {grade_id(c): c for c in solution.cells if grade_id(c) in QUESTIONS}
    assert list(tests) == QUESTIONS
    for test, cell in tests.items():
        hidden = _hidden_region(cell.source)
        assert "grade_pick" in hidden or "grade_number" in hidden, test
    released = "\n".join(c.source for c in release.cells)
    assert "HIDDEN TESTS" not in released and "BEGIN SOLUTION" not in released
    assert "grade_pick" not in released and "grade_number" not in released


def test_the_release_writes_no_answer_down():
    solution, release = read(SOLUTION), read(RELEASE)
    released = "\n".join(c.source for c in release.cells)
    answers = [c for c in solution.cells if (grade_id(c) or "").endswith("_answer")]
    assert len(answers) == len(QUESTIONS)
    for cell in answers:
        region = cell.source.split("### BEGIN SOLUTION\n")[1].split("### END SOLUTION")[0]
        assert region.strip() and region.strip() not in released, grade_id(cell)


def test_every_choice_question_offers_the_letters_its_test_accepts():
    nb = read(SOLUTION)
    cells = {grade_id(c): c.source for c in nb.cells}
    choices = [q for q in QUESTIONS if f"{q}_choices" in cells]
    assert choices == list(CHOICE)
    for q in choices:
        offered = re.findall(r'^    "([a-z])": ', cells[f"{q}_choices"], re.M)
        assert offered == list("abcd"), q
        answer = re.search(rf'^{q} = "([a-z])"$', cells[f"{q}_answer"], re.M).group(1)
        assert answer in offered, q
        assert f'check_pick("{q}", {q})' in cells[q], q


# ----------------------------------------------------------------------------- balance

# A learner who ignores the questions must not pass the quiz. Limits, as shares of the
# multiple-choice points: always the longest option (or always the shortest: the same tell,
# turned round), and always one letter.
LENGTH_LIMIT = 0.30
LETTER_LIMIT = 1 / 3
LETTER_FLOOR = 1 / 8  # each letter is right this often at least: the letters are spread


def choice_questions(nb) -> dict[str, tuple[dict[str, str], str]]:
    """{qid: (options, right letter)} for each multiple-choice question (the package's CHOICE):
    the options as its buttons offer them, the letter that its hidden test grades right."""
    questions = {}
    for qid in CHOICE:
        buttons = ast.parse(cell_by_grade_id(nb, f"{qid}_choices").source).body[0].value
        options = ast.literal_eval(buttons.args[1])  # choose("q07", {"a": "...", ...})
        hidden = ast.parse(_hidden_region(cell_by_grade_id(nb, qid).source))
        (call,) = [node for node in ast.walk(hidden) if isinstance(node, ast.Call)
                   and getattr(node.func, "id", None) == "grade_pick"]
        questions[qid] = (options, ast.literal_eval(call.args[2]))  # grade_pick(q, q07, "c")
    return questions


def longest(options: dict[str, str]) -> list[str]:
    most = max(map(len, options.values()))
    return [letter for letter, text in options.items() if len(text) == most]


def shortest(options: dict[str, str]) -> list[str]:
    least = min(map(len, options.values()))
    return [letter for letter, text in options.items() if len(text) == least]


def share(questions, pick) -> float:
    """The share of the multiple-choice points that `pick` earns: pick(options) names the
    letters it would choose among, each as likely (ties)."""
    points = ASSIGNMENT.points
    earned = sum(points[qid] * (right in pick(options)) / len(pick(options))
                 for qid, (options, right) in questions.items())
    return earned / sum(points[qid] for qid in questions)


def test_the_strategies_score_a_quiz_with_a_tell():
    tell = {"q01": ({"a": "right, and said at length", "b": "wrong"}, "a"),
            "q05": ({"a": "no", "b": "yes, right here", "c": "nope"}, "b")}
    assert share(tell, longest) == 1.0
    assert share(tell, shortest) == 0.0
    assert share(tell, lambda options: ["a"]) == 0.5
    tie = {"q01": ({"a": "same", "b": "also", "c": "x"}, "a")}
    assert share(tie, longest) == 0.5


@pytest.mark.parametrize("strategy", [longest, shortest], ids=lambda f: f.__name__)
def test_always_picking_the_longest_or_shortest_option_fails_the_quiz(strategy):
    questions = choice_questions(read(SOLUTION))
    earned = share(questions, strategy)
    told = [qid for qid, (options, right) in questions.items() if right in strategy(options)]
    assert earned <= LENGTH_LIMIT, (
        f"always the {strategy.__name__} option earns {earned:.0%} of the multiple-choice points "
        f"(at most {LENGTH_LIMIT:.0%}): it is right in {', '.join(told)}. There, give a "
        "distractor the right option's length, or reword the right option.")


def test_the_right_letters_are_spread_over_the_choices():
    questions = choice_questions(read(SOLUTION))
    for letter in "abcd":
        earned = share(questions, lambda options, letter=letter: [letter])
        right = [qid for qid, (_, answer) in questions.items() if answer == letter]
        assert LETTER_FLOOR <= earned <= LETTER_LIMIT, (
            f'always "{letter}" earns {earned:.0%} of the multiple-choice points (between '
            f"{LETTER_FLOOR:.0%} and {LETTER_LIMIT:.0%}): it is right in {', '.join(right)}. "
            "Reorder the options of some of them.")


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake, signed_in):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message."""
    signed_in("ada")
    SPEC.expect_checker_teaches(mistake)
