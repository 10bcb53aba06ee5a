"""What progress() shows: one row per part, as text (terminal) or an HTML table (notebook)."""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

PASS, FAIL, NOT_STARTED, NOT_DEFINED = "pass", "fail", "not started", "not defined"
MESSAGE_LINES = 4  # the first lines of a checker's message: enough to teach, short enough to scan


@dataclass(frozen=True)
class PartResult:
    """How one part of a lab fares against its visible checks."""

    part: str  # the part's name (its test cell's grade_id without "test_")
    points: float  # what the part is worth when its hidden tests pass too
    status: str  # PASS, FAIL, NOT_STARTED or NOT_DEFINED
    message: str = ""  # why, for anything but PASS: the checker's teaching message, shortened
    output: str = ""  # what the checks printed (not shown in the table)

    @property
    def passed(self) -> bool:
        return self.status == PASS


def shorten(message: str, lines: int = MESSAGE_LINES, width: int = 600) -> str:
    """The first `lines` non-empty lines of `message`, at most `width` characters."""
    kept = [line.rstrip() for line in message.strip().splitlines() if line.strip()][:lines]
    text = "\n".join(kept)
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass(frozen=True)
class Report:
    """Every part progress() looked at, for one lab."""

    lab: str
    results: tuple[PartResult, ...]

    @property
    def points_passed(self) -> float:
        return sum(r.points for r in self.results if r.passed)

    @property
    def points_total(self) -> float:
        return sum(r.points for r in self.results)

    def summary(self) -> str:
        done = sum(r.passed for r in self.results)
        return (f"{self.lab}: {done} of {len(self.results)} parts pass their visible tests "
                f"({self.points_passed:g} of {self.points_total:g} points; the hidden tests "
                "decide the grade)")

    def __str__(self) -> str:
        width = max([len(r.part) for r in self.results] + [4])
        rows = [self.summary(), f"{'part':<{width}}  points  status"]
        for r in self.results:
            rows.append(f"{r.part:<{width}}  {r.points:>6g}  {r.status}")
            indent = " " * (width + 10)  # under the status column
            rows += [textwrap.fill(line, 100, initial_indent=indent, subsequent_indent=indent)
                     for line in r.message.splitlines()]
        return "\n".join(rows)

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython in a terminal
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colours = {PASS: "#1a7f37", FAIL: "#cf222e"}
        body = "".join(
            f"<tr><td><code>{html.escape(r.part)}</code></td><td>{r.points:g}</td>"
            f"<td style='color:{colours.get(r.status, '#6e7781')}'><b>{r.status}</b></td>"
            f"<td style='text-align:left;white-space:pre-wrap'>{html.escape(r.message)}</td></tr>"
            for r in self.results)
        return (f"<p>{html.escape(self.summary())}</p><table><thead><tr><th>part</th>"
                f"<th>points</th><th>status</th><th style='text-align:left'>what to look at</th>"
                f"</tr></thead><tbody>{body}</tbody></table>")
