"""The course quiz: buttons for multiple-choice answers, and the checks its test cells call.

    choose("q07", {"a": "...", "b": "...", "c": "..."})   # buttons; a click sets q07
    check_pick("q07", q07)                    # visible test: one of the offered letters
    check_number("q12", q12, unit="ms")       # visible test: a plain, finite number
    grade_pick("q07", q07, answer)            # hidden test: the right letter
    grade_number("q12", q12, want, unit="ms") # hidden test: within a relative tolerance

Why a click alone is not an answer: nbgrader grades a quiz by running the saved notebook again,
top to bottom, in a fresh kernel. A value set by clicking lives only in the kernel that showed
the buttons, so it is gone at grading time. What the grader sees is the answer cell's text,
`q07 = "c"`. So the buttons are a convenience that says exactly which line to write: a click
stores the pick in the notebook's variable (so that the check below can run at once) as a
`Pick`, a str that remembers it came from a click, and `check_pick` refuses a Pick until the
line is in the answer cell. The answer cell's plain "c" is what the grader then sees.
(Nothing else persists into grading: JupyterLab can save widget state in the notebook's
metadata, but a re-run kernel never reads it back and Colab does not save it; and a frontend
script that edits the answer cell is blocked in Colab, whose outputs live in sandboxed frames.)

Without ipywidgets (or outside a kernel) `choose` shows the choices as text; `Picker.pick`
does what a click does. Checks raise AssertionError with a message that teaches and that never
contains the expected answer (feedback shows the messages of hidden tests).
Taught in: the course quiz, solutions/quiz/quiz.ipynb (one question or more per lesson).
"""

from __future__ import annotations

import html
import math
import numbers

from gpulab.self_check.stubs import STUB_HINT


class Pick(str):
    """A letter picked by clicking: equal to the letter, but not yet in the saved notebook."""


class Picker:
    """One multiple-choice question's buttons: the choices, the pick, and where it is stored.

    namespace: the dict the pick is stored in under `name` (the notebook's globals by default;
    None outside IPython: then the pick is only kept here).
    """

    def __init__(self, name: str, options: dict, namespace=None, interactive: bool | None = None):
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not a Python variable name")
        letters = list(options)
        if len(letters) < 2 or any(not (isinstance(k, str) and len(k) == 1 and k.islower())
                                   for k in letters):
            raise ValueError(f"options must map two or more lower-case letters to choices, "
                             f"got keys {letters!r}")
        self.name = name
        self.options = {k: str(v) for k, v in options.items()}
        self.namespace = _notebook_namespace() if namespace is None else namespace
        current = self.namespace.get(name) if self.namespace is not None else None
        # Shown again after the answer cell ran: start from what it says.
        self.value = current if isinstance(current, str) and current in self.options else None
        wanted = _in_kernel() if interactive is None else bool(interactive)
        self.interactive = wanted and _ipywidgets_installed()  # else: plain text
        self._radio = self._status = self._box = None

    # -- what a click does

    def pick(self, letter: str) -> str:
        """Pick `letter` as a click does: store it in the namespace and say what line to write.
        Returns that line."""
        if letter not in self.options:
            raise ValueError(f"{letter!r} is not one of the choices {', '.join(self.options)}")
        self.value = letter
        if self.namespace is not None:
            self.namespace[self.name] = Pick(letter)
        if self._radio is not None and self._radio.value != letter:
            self._radio.value = letter  # keep the buttons in step when picked from code
        if self._status is not None:
            self._status.value = self._status_html()
        return self.line

    @property
    def line(self) -> str:
        """The line the answer cell must hold for the current pick ('' before any)."""
        return f'{self.name} = "{self.value}"' if self.value else ""

    def status(self) -> str:
        """One sentence under the buttons: what to do next."""
        if not self.value:
            return "Click a choice to see the line to write in the answer cell below."
        return (f"Write {self.line} in the answer cell below and run it: the grader runs the "
                "saved notebook again, where clicks are gone, so only that line counts.")

    def text(self) -> str:
        """The question's choices and status as plain text (the fallback, and text/plain)."""
        lines = [f"{self.name}:"]
        lines += [f"  {'(*)' if k == self.value else '( )'} {k}) {v}"
                  for k, v in self.options.items()]
        return "\n".join(lines + [self.status()])

    # -- display

    def widget(self):
        """The ipywidgets view (built on first use): radio buttons and the status line."""
        if self._box is None:
            import ipywidgets as w

            self._radio = w.RadioButtons(
                options=[(f"{k}) {v}", k) for k, v in self.options.items()], value=self.value,
                layout=w.Layout(width="max-content"))
            self._status = w.HTML(self._status_html())
            self._radio.observe(self._on_click, names="value")
            self._box = w.VBox([self._radio, self._status])
        return self._box

    def _on_click(self, change) -> None:
        if change["new"] is not None and change["new"] != self.value:
            self.pick(change["new"])

    def _status_html(self) -> str:
        text = html.escape(self.status())
        return text.replace(html.escape(self.line), f"<code>{html.escape(self.line)}</code>") \
            if self.line else text

    def _repr_mimebundle_(self, **kwargs):
        bundle = {"text/plain": self.text()}
        if self.interactive:
            bundle.update(self.widget()._repr_mimebundle_(**kwargs) or {})
            bundle["text/plain"] = self.text()  # the widget's own repr says nothing useful
        return bundle

    def __repr__(self) -> str:
        return self.text()


def choose(name: str, options: dict, namespace=None, interactive: bool | None = None) -> Picker:
    """The buttons of question `name`; as a cell's value, the notebook shows them."""
    return Picker(name, options, namespace, interactive)


def _notebook_namespace():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell.user_ns if shell is not None else None


def _in_kernel() -> bool:
    """IPython runs in a kernel, so a frontend may draw widgets (a terminal cannot)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _ipywidgets_installed() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- checks


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
    slips.update({factor: f"2**{30 if key == 'GB' else 20} / 1e{9 if key == 'GB' else 6} "
                  f"(Gi or Mi against G or M)" for key, factor in BINARY_SLIPS.items()
                  if key in unit})
    ratio = abs(number / want)
    for factor, label in slips.items():
        if any(math.isclose(ratio, f, rel_tol=rel) for f in (factor, 1 / factor)):
            return label
    return None


def grade_number(name: str, value, want: float, unit: str, rel: float = 0.01) -> None:
    """Hidden test: `value` is within `rel` (relative) of `want`, computed by the course's own
    functions. The message never gives `want`; it says when the number is right in another
    unit, the most common slip."""
    number = _plain_number(name, value, unit)
    if math.isclose(number, want, rel_tol=rel):
        return
    slip = _unit_slip(number, want, unit, max(rel, 1e-9))
    hint = (f" It is off by a factor of {slip}: check that it is in {unit}, as the question "
            "asks.") if slip else ""
    close = f"within {rel:.0%} of" if rel > 0 else "exactly"  # counts are exact
    raise AssertionError(f"{name} = {number:g} {unit} is not {close} the answer.{hint}")
