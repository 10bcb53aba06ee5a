"""What every explorer shares: controls -> a pure function computing a result -> a rendering.

    ex = roofline_explorer()                  # an Explorer; as a cell's value it shows itself
    ex.set(gpu="H100 SXM", dtype="fp8")       # the same as moving the widgets
    ex.result                                 # what the pure function computed (a dataclass)
    ex.text(), ex.figure()                    # the rendering: a summary and a matplotlib Figure

An explorer is displayed as ONE output holding three representations of itself:

    text/plain                                  the summary for the current values, and a
                                                line naming the controls
    image/png                                   the figure for the current values, captioned
                                                with the same line
    application/vnd.jupyter.widget-view+json    the live widgets (only when interactive)

JupyterLab, Jupyter Notebook and Colab draw the widgets; a viewer without widget support
(GitHub, nbviewer, an HTML export, a lesson opened before its cells run) falls back to the
picture, whose caption says which controls the cell offers once it runs. nbval never compares
widget views (their model ids are random) or pictures, only the text, which for a lesson's
default values is the same on every run: so the committed outputs of a lesson stay checkable.
interactive=False (or no ipywidgets, or no kernel behind IPython) leaves the widget view out: the
static fallback. ipywidgets and matplotlib are imported only when an explorer is drawn.
Taught in: lessons/01, 06 and 07, one explorer each where the idea is taught.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LABEL_MARGIN_CHARS = 2  # a proportional font's label is narrower than its count of "0"s
CONTROL_WIDTH = "19em"  # the slider, dropdown or box right of the label


@dataclass(frozen=True)
class Control:
    """One knob of an explorer: a keyword argument of its compute function."""

    name: str  # the keyword it sets
    label: str  # what the widget says next to it
    default: Any
    options: tuple = ()  # the values to choose from ("dropdown"), or (min, max) ("slider")
    kind: str = "dropdown"  # "dropdown", "slider" (ints), "number" (a positive int), "checkbox"
    used_when: tuple = ()  # (control, value): it matters only then; greyed out otherwise

    def check(self, value) -> None:
        """ValueError, naming the allowed values, when `value` is not one of them."""
        if self.kind == "dropdown" and value not in self.options:
            raise ValueError(f"{self.name}={value!r} is not offered; choose one of "
                             f"{', '.join(map(repr, self.options))}")
        whole = isinstance(value, int) and not isinstance(value, bool)
        if self.kind == "slider" and not (whole and self.options[0] <= value <= self.options[1]):
            raise ValueError(f"{self.name} must be an int from {self.options[0]} to "
                             f"{self.options[1]}, got {value!r}")
        if self.kind == "number" and not (whole and value >= 1):
            raise ValueError(f"{self.name} must be an int >= 1, got {value!r}")
        if self.kind == "checkbox" and not isinstance(value, bool):
            raise ValueError(f"{self.name} must be True or False, got {value!r}")

    def used(self, values: dict) -> bool:
        """Whether this control matters for `values` (see used_when)."""
        return not self.used_when or values[self.used_when[0]] == self.used_when[1]

    def widget(self, value, label_chars: int):
        """Its ipywidget, with room for `label_chars` characters of label (the explorer's
        longest, so that its controls line up and no label is cut short)."""
        import ipywidgets as w

        label_width = f"{label_chars + LABEL_MARGIN_CHARS}ch"
        style = {"description_width": label_width}
        layout = w.Layout(width=f"calc({label_width} + {CONTROL_WIDTH})")
        common = dict(description=self.label, value=value, style=style, layout=layout)
        if self.kind == "slider":
            return w.IntSlider(min=self.options[0], max=self.options[1], **common)
        if self.kind == "number":
            return w.BoundedIntText(min=1, max=2**40, **common)
        if self.kind == "checkbox":
            return w.Checkbox(indent=False, **common)
        return w.Dropdown(options=list(self.options), **common)


def _has_ipywidgets() -> bool:
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def widgets_available() -> bool:
    """Whether widgets can be shown here: ipywidgets is installed and IPython runs in a kernel
    (a terminal IPython or plain Python has no frontend to draw them)."""
    if not _has_ipywidgets():
        return False
    from IPython import get_ipython  # ipywidgets depends on IPython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Explorer:
    """Controls, a pure function of their values, and how to show its result.

    compute(**values) -> result (raises ValueError for a combination that makes no sense);
    describe(result) -> str; draw(result) -> matplotlib Figure.
    """

    def __init__(self, title: str, controls: list[Control], compute: Callable,
                 describe: Callable, draw: Callable, values: dict, interactive: bool | None):
        self.title = title
        self.controls = {c.name: c for c in controls}
        self.compute, self.describe, self.draw = compute, describe, draw
        self.values = {c.name: c.default for c in controls}
        self.interactive = widgets_available() if interactive is None else bool(interactive)
        if self.interactive and not _has_ipywidgets():
            raise ImportError(f"{title}: interactive=True needs ipywidgets (pip install "
                              "ipywidgets); interactive=False shows the static text and picture")
        self._widgets: dict = {}  # name -> ipywidget, once built
        self._output = None  # the ipywidgets.Output the rendering goes to
        self._box = None
        self._holding = False  # True while set() moves several widgets at once
        self.set(**values)

    def set(self, **values) -> Explorer:
        """Change some controls (as moving their widgets would) and return the explorer."""
        for name, value in values.items():
            if name not in self.controls:
                raise ValueError(f"{self.title} has no control {name!r}; its controls are "
                                 f"{', '.join(self.controls)}")
            self.controls[name].check(value)
        self.values.update(values)
        if self._box is not None:
            self._holding = True  # move every widget first, then render once
            try:
                for name, value in values.items():
                    self._widgets[name].value = value
            finally:
                self._holding = False
            self._render()
        return self

    @property
    def result(self):
        """What compute makes of the current values (ValueError when it makes nothing)."""
        return self.compute(**self.values)

    @property
    def error(self) -> str | None:
        """Why the current values give no result, or None when they give one."""
        try:
            _ = self.result
        except ValueError as e:
            return str(e)
        return None

    def text(self) -> str:
        """The summary for the current values, or what is wrong with them."""
        try:
            return f"{self.title}\n{self.describe(self.result)}"
        except ValueError as e:
            return f"{self.title}\nno result for these values: {e}"

    def figure(self):
        """The picture for the current values (a matplotlib Figure), or None without a result."""
        return None if self.error else self.draw(self.result)

    def controls_line(self) -> str:
        """One line naming the controls: what the static fallback says about the live view."""
        labels = ", ".join(c.label for c in self.controls.values())
        return f"controls, once the cell runs in JupyterLab or Colab: {labels}"

    def static_figure(self):
        """The figure with the controls line under it, or None without a result."""
        fig = self.figure()
        if fig is not None:  # just under what is drawn; savefig's tight box grows to take it in
            bottom = fig.get_tightbbox().y0 / fig.get_size_inches()[1]
            fig.text(0.01, bottom, self.controls_line(), ha="left", va="top", fontsize=8,
                     color="dimgray")
        return fig

    def png(self, static: bool = False) -> str | None:
        """The figure (static: captioned with the controls line) as a base64 PNG, the form
        notebooks store pictures in."""
        fig = self.static_figure() if static else self.figure()
        if fig is None:
            return None
        buf = io.BytesIO()
        fig.savefig(buf, format="png", **({"bbox_inches": "tight"} if static else {}))
        return base64.b64encode(buf.getvalue()).decode("ascii")

    # --- widgets -------------------------------------------------------------------------------

    def widget(self):
        """The live view: the controls above the rendering (an ipywidgets VBox), built once."""
        if self._box is None:
            import ipywidgets as w

            label_chars = max(len(c.label) for c in self.controls.values())
            self._widgets = {n: c.widget(self.values[n], label_chars)
                             for n, c in self.controls.items()}
            for name, widget in self._widgets.items():
                widget.observe(lambda change, name=name: self._changed(name, change["new"]),
                               names="value")
            self._output = w.Output()
            self._box = w.VBox([w.HTML(f"<b>{self.title}</b>"), *self._widgets.values(),
                                self._output])
            self._grey_out_unused()
            self._render()
        return self._box

    @property
    def widgets(self) -> dict:
        """name -> the ipywidget of that control (building the live view if needed): setting
        one's .value is what a learner's click does."""
        self.widget()
        return dict(self._widgets)

    @property
    def outputs(self) -> tuple:
        """What the live view shows under the controls now (notebook output dicts)."""
        return self._output.outputs if self._output is not None else ()

    def _changed(self, name: str, value) -> None:
        self.values[name] = value
        self._grey_out_unused()
        if not self._holding:
            self._render()

    def _grey_out_unused(self) -> None:
        """Disable the widgets of controls the current values ignore (see Control.used_when)."""
        for name, control in self.controls.items():
            self._widgets[name].disabled = not control.used(self.values)

    def _render(self) -> None:
        # Outputs set on the widget's state, not captured with `with output:`: the same on
        # every frontend, and in a test without any frontend.
        shown = [{"output_type": "stream", "name": "stdout", "text": self.text() + "\n"}]
        png = self.png()
        if png is not None:
            shown.append({"output_type": "display_data", "metadata": {},
                          "data": {"image/png": png, "text/plain": "<Figure>"}})
        self._output.outputs = tuple(shown)

    # --- display -------------------------------------------------------------------------------

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {"text/plain": f"{self.text()}\n{self.controls_line()}"}
        png = self.png(static=True)
        if png is not None:
            bundle["image/png"] = png
        if self.interactive:
            bundle[WIDGET_VIEW] = {"version_major": 2, "version_minor": 0,
                                   "model_id": self.widget().model_id}
        return bundle

    def show(self) -> None:
        """Display the explorer from anywhere in a cell (not only as its value)."""
        from IPython.display import display

        display(self)

    def __repr__(self) -> str:
        return self.text()
