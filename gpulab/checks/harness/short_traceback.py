"""How a checker's failure shows in a notebook: its message first, then the line of the learner's
code that raised (when one did), and nothing of the checker's internals or the simulator's threads.

    AssertionError: saxpy is not started: it raised NotImplementedError.
    Replace `raise NotImplementedError()` with your kernel's code.
    Cell In[4], line 5, in saxpy
    ----> 5     raise NotImplementedError()
    (%tb shows the full traceback)

IPython's own traceback of the same failure runs to 60-80 lines through Numba's simulator and
threading.py, with the message last. `install_in_ipython` hands IPython a handler for
AssertionError and NotImplementedError (InteractiveShell.set_custom_exc): one raised while a
checker was running (a gpulab.checks frame on its traceback) shows in the short form above;
any other shows as IPython shows it. The handler sends the short form as the cell's error
(ipykernel's _showtraceback), so the cell still fails: nbgrader scores it 0, and the error's
name and message are the exception's own, as its feedback page quotes them.

Installed when the harness is first imported in an IPython kernel (harness/__init__.py). The
grading kernel imports the checkers before its integrity guard takes its snapshot
(autograder/integrity.py), so the handler is part of that snapshot, not a change to it.
"""

from __future__ import annotations

import linecache
import sys
import traceback

from gpulab.checks.harness.whose import is_learners
from gpulab.stubs import is_stub_error, not_started

CHECKS_PACKAGE = "gpulab.checks"
HANDLED = (AssertionError, NotImplementedError)
RED, DIM, RESET = "\x1b[0;31m", "\x1b[2m", "\x1b[0m"
FOOTER = "(%tb shows the full traceback)"
def _in_checks(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == CHECKS_PACKAGE or module.startswith(CHECKS_PACKAGE + ".")


def raised_in_checker(error: BaseException) -> bool:
    """True when `error` passed through a checker on its way to the cell."""
    return any(_in_checks(frame) for frame, _ in traceback.walk_tb(error.__traceback__))


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions behind it (its __cause__ or __context__), outermost first."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        chain.append(error)
        seen.add(id(error))
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return chain


def learner_line(error: BaseException) -> tuple[str, int, str] | None:
    """(file, line, function) of the learner's code where `error`, or the error behind it, was
    raised: the innermost of their frames, below the checker. None when the checker raised on
    its own (a wrong result: no line of theirs failed)."""
    for depth, exc in reversed(list(enumerate(_chain(error)))):
        frames = list(traceback.walk_tb(exc.__traceback__))
        if depth == 0:  # the cell's own frames sit above the checker: only what it called
            first = next((i for i, (f, _) in enumerate(frames) if _in_checks(f)), len(frames))
            frames = frames[first:]
        for frame, lineno in reversed(frames):
            if is_learners(frame.f_code.co_filename):
                return frame.f_code.co_filename, lineno, frame.f_code.co_name
    return None


def short_traceback(error: BaseException, shell=None, color: bool = True) -> list[str]:
    """The lines a notebook shows for a checker's failure (see the module's docstring)."""
    red, dim, reset = (RED, DIM, RESET) if color else ("", "", "")
    name = type(error).__name__
    message = str(error).strip()
    if is_stub_error(error):  # a stub the checker called without catching its error
        stub, _ = list(traceback.walk_tb(error.__traceback__))[-1]
        message = not_started(stub.f_code.co_name)
    lines = [f"{red}{name}{reset}: {message}" if message else f"{red}{name}{reset}"]
    where = learner_line(error)
    if where is not None:
        filename, lineno, function = where
        label = _cell_label(shell, filename)
        place = f"{label}, line {lineno}" if label else f"File {filename}:{lineno}"
        lines.append(place if function == "<module>" else f"{place}, in {function}")
        source = linecache.getline(filename, lineno).rstrip()
        if source:
            lines.append(f"----> {lineno} {source}")
    lines.append(f"{dim}{FOOTER}{reset}")
    return lines


def _cell_label(shell, filename: str) -> str | None:
    """"Cell In[4]" for a notebook cell's file, as IPython names it; None for a real file."""
    compiler = getattr(shell, "compile", None)
    label = compiler.format_code_name(filename) if hasattr(compiler, "format_code_name") else None
    return f"{label[0]} {label[1]}" if label else None


def show_failure(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler (set_custom_exc): the short form for a checker's
    failure, IPython's own traceback for anything else (or when %pdb is on)."""
    try:
        if getattr(shell, "call_pdb", False) or not raised_in_checker(value):
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return None
        color = str(getattr(shell, "colors", "")).lower() != "nocolor"
        stb = short_traceback(value, shell, color)
    except Exception:  # never let the display hide the failure: fall back to IPython's own
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    # As IPython's showtraceback does, so that %tb and %debug find this failure.
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value
    shell._showtraceback(etype, value, stb)  # ipykernel: the cell's error message and reply
    return None


def install_in_ipython() -> bool:
    """Show checker failures in the short form in the IPython shell this runs in, if any.
    Leaves a custom handler that someone else installed alone. True when installed."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if shell.custom_exceptions == HANDLED:  # installed already (a reload, a second import)
        return True
    if shell.custom_exceptions:
        return False
    shell.set_custom_exc(HANDLED, show_failure)
    return True
