"""`feedback LAB`: one HTML page per learner that teaches without giving the hidden tests away.

nbgrader 0.9's generate_feedback renders the autograded notebook as it is, and autograding
has put the hidden tests back into every test cell: the page shows their source, their
tracebacks (which quote test lines) and whatever they printed. That is by design upstream
(jupyter/nbgrader#917, no option to turn it off), so this module adds a preprocessor to
nbgrader's feedback pipeline, between GetGrades and the HTML export:

    test cell       its source becomes its description line (the docstring's first line, which
                    states the points); its outputs become "passed", or the exception's type
                    and message (the checkers' teaching text), truncated, with any line that
                    quotes a hidden test removed
    learner's cell  keeps its outputs, minus any line that quotes a hidden test (a learner can
                    print the kernel's input history, which holds the hidden tests it ran)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from traitlets import Bool

from autograder.course import Course, CourseError, check_student_id, run_converter

BEGIN_HIDDEN, END_HIDDEN = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"  # nbgrader's delimiters
MAX_MESSAGE_CHARS = 800  # a teaching message is a few sentences; a dumped array is not
MIN_QUOTE_CHARS = 6  # shorter hidden lines (`)`, `pass`) match too much text to be a quote
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TIMEOUT_ERRORS = {"CellTimeoutError", "TimeoutError"}


def is_test_cell(cell: NotebookNode) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and meta.get("grade", False) and not meta.get("solution", False)


def hidden_lines(source: str) -> set[str]:
    """The stripped, non-empty lines of a cell's hidden-test regions."""
    lines, inside = set(), False
    for line in source.splitlines():
        if BEGIN_HIDDEN in line:
            inside = True
        elif END_HIDDEN in line:
            inside = False
        elif inside and line.strip():
            lines.add(line.strip())
    return lines


def quotes_hidden(line: str, hidden: set[str], hidden_text: str) -> bool:
    """True when `line` contains a hidden test line, or is itself a piece of one."""
    text = line.strip()
    if len(text) >= MIN_QUOTE_CHARS and text in hidden_text:
        return True
    return any(h in line for h in hidden if len(h) >= MIN_QUOTE_CHARS)


def redact(text: str, hidden: set[str]) -> str:
    """`text` without the lines that quote hidden tests."""
    if not hidden:
        return text
    hidden_text = "\n".join(hidden)
    kept = [
        ln for ln in text.splitlines(keepends=True) if not quotes_hidden(ln, hidden, hidden_text)
    ]
    return "".join(kept)


def describe(cell: NotebookNode) -> str:
    """A test cell's description: its docstring's first line, else its first comment."""
    try:
        tree = ast.parse(cell.source)
        doc = ast.get_docstring(tree, clean=True) if tree.body else None
    except SyntaxError:
        doc = None
    if doc:
        return doc.strip().splitlines()[0]
    for line in cell.source.splitlines():
        if line.strip().startswith("#") and BEGIN_HIDDEN not in line and END_HIDDEN not in line:
            return line.strip().lstrip("#").strip()
    return f"test {cell.metadata['nbgrader']['grade_id']}"


def failure(cell: NotebookNode, hidden: set[str]) -> tuple[str, str] | None:
    """(exception type, message) for a test cell that raised; None for one that passed.

    The message is the checker's teaching text, without lines that quote hidden tests and cut
    to MAX_MESSAGE_CHARS; never the traceback, which quotes the test cell's code.
    """
    errors = [out for out in cell.outputs if out.output_type == "error"]
    if not errors:
        return None
    # On a timeout the kernel is interrupted (KeyboardInterrupt) and nbgrader then appends a
    # CellTimeoutError: the timeout is what the learner needs to hear about.
    errors.sort(key=lambda out: ANSI.sub("", out.ename) not in TIMEOUT_ERRORS)
    ename, evalue = ANSI.sub("", errors[0].ename), ANSI.sub("", errors[0].evalue or "")
    if ename in TIMEOUT_ERRORS and not evalue.strip():
        evalue = "the test ran past the time limit (an endless loop, or a very slow kernel?)"
    message = redact(evalue, hidden).strip()
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS].rstrip() + " [...]"
    return ename, message


def scrub_output(output: NotebookNode, hidden: set[str]) -> NotebookNode:
    """A learner cell's output without lines that quote hidden tests."""
    if output.output_type == "stream":
        output.text = redact(output.text, hidden)
    elif output.output_type == "error":
        output.evalue = redact(output.evalue, hidden)
        output.traceback = [_redact_colored(entry, hidden) for entry in output.traceback]
    elif output.output_type in ("display_data", "execute_result"):
        for mime, value in list(output.data.items()):
            text = value if isinstance(value, str) else "".join(value)
            if mime.startswith("text/") and redact(text, hidden) != text:
                if mime == "text/plain":
                    output.data[mime] = redact(text, hidden)
                else:  # markup cannot be cut by lines safely: drop that representation
                    del output.data[mime]
    return output


def _redact_colored(entry: str, hidden: set[str]) -> str:
    """A traceback entry without quotes of hidden tests; IPython colors each token, so the
    colors go (only) where something had to be cut."""
    plain = ANSI.sub("", entry)
    kept = redact(plain, hidden)
    return entry if kept == plain else kept


class ScrubTestCells(Preprocessor):
    """Feedback preprocessor: test cells show a verdict, never test code or its output."""

    enabled = Bool(True, help="nbconvert skips a preprocessor that is not enabled").tag(config=True)

    def preprocess(self, nb, resources):
        hidden = set().union(*(hidden_lines(c.source) for c in nb.cells if is_test_cell(c)))
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            if is_test_cell(cell):
                failed = failure(cell, hidden)
                cell.source = f"# {describe(cell)}"
                if failed is None:
                    cell.outputs = [new_output("stream", name="stdout", text="passed\n")]
                else:  # a one-line "traceback", so nbconvert renders it as an error
                    ename, message = failed
                    line = f"{ename}: {message}" if message else ename
                    cell.outputs = [
                        new_output("error", ename=ename, evalue=message, traceback=[line])
                    ]
            else:
                cell.outputs = [scrub_output(out, hidden) for out in cell.outputs]
        return nb, resources


def generate_feedback(course: Course, lab: str, student_id: str | None = None) -> list[Path]:
    """Write feedback/<student>/<lab>/<notebook>.html for every autograded submission."""
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.converters import GenerateFeedback
    from nbgrader.preprocessors import GetGrades

    pattern = check_student_id(student_id) if student_id else "*"
    graded = sorted((course.grading / "autograded").glob(f"{pattern}/{lab}"))
    if not graded:
        who = f"for {student_id} " if student_id else ""
        raise CourseError(
            f"no autograded submission of {lab} {who}in {course.grading}; run "
            f"`python -m autograder grade {lab} SUBMISSIONS` first."
        )
    run_converter(
        GenerateFeedback,
        course.grading,
        lab,
        pattern,
        **{
            "GenerateFeedback.force": True,
            "GenerateFeedback.preprocessors": [
                GetGrades,
                ScrubTestCells,
                CSSHTMLHeaderPreprocessor,
            ],
        },
    )
    students = [folder.parent.name for folder in graded]
    return sorted(
        path
        for student in students
        for path in (course.grading / "feedback" / student / lab).glob("*.html")
    )
