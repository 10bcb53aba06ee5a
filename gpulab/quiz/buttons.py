"""The course quiz's buttons for multiple-choice answers (its checks: gpulab/checks/quiz/).

    choose("q07", {"a": "...", "b": "...", "c": "..."})   # buttons; a click sets q07

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
does what a click does.
Taught in: the course quiz, solutions/quiz/quiz.ipynb (one question or more per lesson).
"""

from __future__ import annotations

import html


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
