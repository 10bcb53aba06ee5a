"""Bounded outputs for the grading executor: a learner's cell can print gigabytes, the grader
keeps a bounded amount, and decides so as each message arrives, never after storing it all.

    cell_output_limit       characters kept per cell (text, every representation, traces)
    notebook_output_limit   characters kept per notebook
Past a limit, streams are cut and displays dropped, and the cell gets a note saying so. Errors
and results are never dropped, only shortened: scoring reads them (autograder/scoring.py), so
a flood must not erase the error that fails a test, or the number that gives partial credit.
Two more bounds live elsewhere: the kernel caps its own streams (autograder/integrity.py), and
the grader's sockets refuse a message over message_size_limit (autograder/execute.py).
"""

from __future__ import annotations

import json

from nbformat.v4 import new_output
from traitlets import Integer
from traitlets.config import Configurable

MAX_KEPT_CHARS = 10_000  # of an error's message, a traceback line, a result's text
MAX_TRACEBACK_LINES = 400


class OutputCaps(Configurable):
    """Mixin for nbclient's NotebookClient: its output handlers, with the limits applied."""

    cell_output_limit = Integer(1_000_000, help="characters of output kept per cell").tag(
        config=True)
    notebook_output_limit = Integer(10_000_000, help="characters of output per notebook").tag(
        config=True)

    def reset_output_caps(self, notebook: bool = False) -> None:
        """Call before each cell (notebook=True: before the first)."""
        self._cell_chars, self.capped = 0, False
        if notebook:
            self._notebook_chars = 0

    def cap_note(self) -> str:
        """What a capped cell is told, in its last output."""
        whole = self._notebook_chars >= self.notebook_output_limit
        limit = self.notebook_output_limit if whole else self.cell_output_limit
        what = "this notebook's output" if whole else "this cell's output"
        return f"the grader kept {limit:,} characters of {what} and dropped the rest"

    def add_cap_note(self, cell) -> str:
        note = self.cap_note()
        cell.outputs.append(new_output("display_data", data={"text/plain": f"[{note}]"},
                                       metadata={}))
        return note

    def output(self, outs, msg, display_id, cell_index):
        content = msg["content"]
        if msg["msg_type"] in ("error", "execute_result"):
            shorten(content)
            self._count(size_of(content))
            return super().output(outs, msg, display_id, cell_index)
        room, size = self._room(), size_of(content)
        if size > room:
            self.capped = True
            if msg["msg_type"] != "stream" or room <= 0:
                return None
            content["text"], size = content["text"][:room], room
        self._count(size)
        return super().output(outs, msg, display_id, cell_index)

    def _update_display_id(self, display_id, msg):
        if size_of(msg["content"]) > self._room():
            self.capped = True
            return None
        return super()._update_display_id(display_id, msg)

    def handle_comm_msg(self, outs, msg, cell_index):
        size = size_of(msg["content"])
        if size > self._room():  # a widget's state: kept with the notebook, so it counts
            self.capped = True
            return None
        self._count(size)
        return super().handle_comm_msg(outs, msg, cell_index)

    def _room(self) -> int:
        return min(self.cell_output_limit - self._cell_chars,
                   self.notebook_output_limit - self._notebook_chars)

    def _count(self, size: int) -> None:
        self._cell_chars += size
        self._notebook_chars += size


def shorten(content: dict) -> None:
    """An error or a result, small enough to keep: scoring needs it, not megabytes of it."""
    if "evalue" in content:
        content["evalue"] = _cut(content["evalue"])
    if "traceback" in content:
        lines = content["traceback"]
        if len(lines) > MAX_TRACEBACK_LINES:
            half = MAX_TRACEBACK_LINES // 2
            lines = [*lines[:half], "[...]", *lines[-half:]]
        content["traceback"] = [_cut(line) for line in lines]
    data = content.get("data") or {}
    for mime in list(data):
        if mime == "text/plain":
            data[mime] = _cut(data[mime])
        elif size_of({"data": {mime: data[mime]}}) > MAX_KEPT_CHARS:
            del data[mime]


def size_of(content: dict) -> int:
    """Characters a message would add to the notebook: text, every representation, a trace."""
    size = len(content.get("text") or "") + len(content.get("evalue") or "")
    size += sum(len(line) for line in content.get("traceback") or ())
    for value in (content.get("data") or {}).values():
        size += len(value) if isinstance(value, str) else len(json.dumps(value))
    return size


def _cut(text) -> str:
    text = text if isinstance(text, str) else "".join(text)
    return text if len(text) <= MAX_KEPT_CHARS else text[:MAX_KEPT_CHARS] + " [...]"
