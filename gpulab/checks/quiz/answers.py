"""The checks the quiz's test cells call. Each raises AssertionError with a message that teaches
and that never contains the expected answer (feedback shows the messages of hidden tests).

    check_pick("q07", q07)                    # visible test: one of the offered letters
    check_number("q12", q12, unit="ms")       # visible test: a plain, finite number
    grade_pick("q07", q07, answer)            # hidden test: the right letter
    grade_number("q12", q12, want, unit="ms") # hidden test: within a relative tolerance

A wrong number's message names its mistake when it is one of the question's known slips
(slips.py), and the lesson section where the formula is taught:

    grade_number("q19", q19, want, unit="microbatches", rel=0.0,   # a count: exactly
                 slips=known_slips("q19", mine.learner), see="Lesson 06, section 6")

A click alone is not an answer (gpulab/quiz/buttons.py says why): a Pick is refused until the answer
cell holds its letter.
"""

from __future__ import annotations

import math
import numbers

from gpulab.quiz import Pick
from gpulab.stubs import STUB_HINT


def _unanswered(name: str, example: str) -> AssertionError:
    return AssertionError(
        f"{name} is still None: its answer cell raised NotImplementedError before setting it. "
        f"{STUB_HINT} Here that is one line: {name} = {example}.")


def _letter(name: str, value, letters: str) -> str:
    """The learner's pick as a plain lower-case letter, or an AssertionError saying what is
    wrong with its form."""
    if value is None:
        raise _unanswered(name, '"<your letter>"')
    if isinstance(value, Pick):
        raise AssertionError(
            f'You clicked "{value}" for {name}, but the answer cell does not say so yet. The '
            f'grader runs the saved notebook again, where clicks are gone: write {name} = '
            f'"{value}" in the answer cell, run it, and save the notebook.')
    if not isinstance(value, str):
        raise AssertionError(f'{name} must be a letter in quotes, {name} = "<your letter>", '
                             f'not a {type(value).__name__}.')
    letter = str.lower(str.strip(value))  # str's own methods: the plain text of any str
    if letter not in letters:
        raise AssertionError(f'{name} = {value!r} is not one of the choices: write one of the '
                             f'letters {", ".join(letters)} in quotes.')
    return letter


def check_pick(name: str, value, letters: str = "abcd") -> None:
    """Visible test: `value` is one of `letters`, written in the answer cell (not only clicked)."""
    _letter(name, value, letters)


def grade_pick(name: str, value, answer: str, letters: str = "abcd", see: str = "") -> None:
    """Hidden test: the pick is `answer`. The message names the pick, never the answer."""
    letter = _letter(name, value, letters)
    if letter != answer:
        where = f" {see} explains it." if see else ""
        raise AssertionError(f'{name}: "{letter}" is not the best choice.{where}')


def _plain_number(name: str, value, unit: str) -> float:
    """`value` as a plain float, or an AssertionError saying what is wrong with its form."""
    if value is None:
        raise _unanswered(name, f"<a number in {unit}>")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "True/False" if isinstance(value, bool) else f"a {type(value).__name__}"
        raise AssertionError(f"{name} must be a number in {unit} (such as {name} = 12.5), not "
                             f"{kind}. Give the number alone: the unit is the question's.")
    # float's and int's own methods: a subclass cannot pretend to be another number.
    if isinstance(value, float):
        number = float(float.__repr__(value))
    elif isinstance(value, int):
        number = float(int.__repr__(value))
    else:  # a NumPy scalar
        number = float(value)
    if not math.isfinite(number):
        raise AssertionError(f"{name} is {number}: the answer is a finite number in {unit}.")
    return number


def check_number(name: str, value, unit: str, low: float | None = None,
                 high: float | None = None) -> None:
    """Visible test: `value` is a finite number, within [low, high] where the question says so
    (a fraction: between 0 and 1)."""
    number = _plain_number(name, value, unit)
    if (low is not None and number < low) or (high is not None and number > high):
        raise AssertionError(f"{name} = {number:g} is outside [{low:g}, {high:g}], the range "
                             f"the question gives for an answer in {unit}.")


# Slips that leave a number right in another unit: factor -> how the message names it.
UNIT_SLIPS = {1e3: "1e3", 1e6: "1e6", 1e9: "1e9", 100.0: "100 (a percentage?)"}
BINARY_SLIPS = {"GB": 2**30 / 1e9, "MB": 2**20 / 1e6}  # GiB for GB, MiB for MB: only 5-7% off


def _unit_slip(number: float, want: float, unit: str, rel: float) -> str | None:
    """How `number` is `want` in another unit ("1e3"), or None."""
    if number == 0 or want == 0:
        return None
    slips = dict(UNIT_SLIPS)
    if unit == "minutes":
        slips[60.0] = "60 (hours or seconds against minutes)"
    slips.update({factor: f"2**{30 if key == 'GB' else 20} / 1e{9 if key == 'GB' else 6} "
                  f"(Gi or Mi against G or M)" for key, factor in BINARY_SLIPS.items()
                  if key in unit})
    ratio = abs(number / want)
    for factor, label in slips.items():
        if any(math.isclose(ratio, f, rel_tol=rel) for f in (factor, 1 / factor)):
            return label
    return None


def _matching_slips(number: float, want: float, slips, rel: float) -> list[str]:
    """The sentences of the known slips whose numbers `number` matches (two slips may give
    the same number). A slip that gives the answer itself (within `rel`) names no mistake."""
    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=max(rel, 1e-6))

    return [sentence for sentence, values in (slips or {}).items()
            if any(close(number, value) and not close(value, want) for value in values)]


def grade_number(name: str, value, want: float, unit: str, rel: float = 0.01,
                 slips: dict | None = None, see: str = "") -> None:
    """Hidden test: `value` is within `rel` (relative) of `want`, computed by the course's own
    functions. The message never gives `want`: it names the mistake when the number is one of
    the question's known `slips` ({sentence: numbers}, checks/quiz/slips.py) or right in
    another unit, and says where the formula is taught (`see`)."""
    number = _plain_number(name, value, unit)
    if math.isclose(number, want, rel_tol=rel):
        return
    close = f"within {rel:.0%} of" if rel > 0 else "exactly"  # counts are exact
    message = f"{name} = {number:g} {unit} is not {close} the answer."
    slip = " Or: ".join(_matching_slips(number, want, slips, rel))
    unit_slip = None if slip else _unit_slip(number, want, unit, max(rel, 1e-9))
    if slip:
        message += f" {slip}"
    elif unit_slip:
        message += (f" It is off by a factor of {unit_slip}: check that it is in {unit}, as "
                    "the question asks.")
    if see:
        message += f" {see} explains it." if slip or unit_slip else f" Revisit {see}."
    raise AssertionError(message)
