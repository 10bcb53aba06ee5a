"""Self-checks for a lab without nbgrader: which parts pass their visible tests, and why not.

    import gpulab
    gpulab.progress("lab1")                  # every part: a table of points, pass/fail, messages
    gpulab.progress("lab1", part="saxpy")    # one part (the cluster and simulator ones are slow)

Run in the lab's notebook, it checks the definitions of that notebook (the IPython namespace)
with the same checker calls as the lab's visible test cells (its package's ASSIGNMENT table,
gpulab/checks/table.py); a part still left as the
stub reads "not started". It never raises for a mistake in the learner's code: the checker's
teaching message goes in the table. Hidden tests are not run: passing here is not the grade.
"""

from __future__ import annotations

import contextlib
import copy
import io
import sys

from gpulab.checks import PACKAGES, find_lab, find_parts, package
from gpulab.checks.table import Answer, Check, Part
from gpulab.env import grading
from gpulab.self_check.report import (
    FAIL,
    NOT_DEFINED,
    NOT_STARTED,
    PASS,
    PartResult,
    Report,
    shorten,
)
from gpulab.stubs import unfinished

TRACEBACK_HINT = "(run the part's test cell to see the whole traceback)"


def check_part(part: Part, namespace: dict, lab: str) -> PartResult:
    """Run `part`'s visible checks on the definitions in `namespace`; never raises for the
    learner's mistakes (KeyboardInterrupt still stops it)."""
    missing = [name for name in part.names if name not in namespace]
    if missing:
        return PartResult(part.name, part.points, NOT_DEFINED,
                          f"{', '.join(missing)} not defined yet: run the cell that defines "
                          f"{'it' if len(missing) == 1 else 'them'} (and the cells above it).")
    stubs = _stubs(part, namespace)
    if stubs:
        return PartResult(part.name, part.points, NOT_STARTED, _still_to_do(stubs, namespace))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            for check in part.checks:
                _run(check, namespace, lab)
    except AssertionError as error:
        message = shorten(str(error)) or f"{part.grade_id} failed (no message). {TRACEBACK_HINT}"
        return PartResult(part.name, part.points, FAIL, message, printed.getvalue())
    except (Exception, SystemExit) as error:  # the learner's code crashed inside the checker
        message = shorten(f"{type(error).__name__}: {error}") + f"\n{TRACEBACK_HINT}"
        return PartResult(part.name, part.points, FAIL, message, printed.getvalue())
    return PartResult(part.name, part.points, PASS, "", printed.getvalue())


def _run(check: Check, namespace: dict, lab: str) -> None:
    from gpulab.checks.keys import answer_key

    checker = getattr(package(lab), check.checker)  # torch and numba: only when a check runs
    kwargs = {key: answer_key(value.name) if isinstance(value, Answer) else copy.deepcopy(value)
              for key, value in check.kwargs.items()}
    checker(*(namespace[name] for name in check.args), **kwargs)


def _stubs(part: Part, namespace: dict) -> list[str]:
    found = []
    for name in part.names:
        try:
            found += unfinished(name, namespace[name])
        except Exception:  # an odd object: let its checker say what is wrong with it
            continue
    return found


def _still_to_do(stubs: list[str], namespace: dict, most: int = 4) -> str:
    """'Still None: a, b.' and/or 'Still `raise NotImplementedError()`: f, C.m.'"""
    def listed(names):
        more = f" and {len(names) - most} more" if len(names) > most else ""
        return ", ".join(names[:most]) + more

    empty = [name for name in stubs if namespace.get(name, ...) is None]
    raising = [name for name in stubs if name not in empty]
    said = ([f"Still None: {listed(empty)}."] if empty else []) + (
        [f"Still `raise NotImplementedError()`: {listed(raising)}."] if raising else [])
    return " ".join(said) + " Write your answer in place of the stub and run its cell."


def run_self_checks(lab: str, part: str | None = None, *, namespace: dict | None = None,
                    progress: bool = True) -> Report:
    """The Report of `lab`'s parts (or the one named `part`) on the definitions in `namespace`
    (default: the notebook's, else the caller's globals), with a tqdm bar over the parts."""
    from tqdm.auto import tqdm

    parts = find_parts(lab, part)
    namespace = _learner_namespace(namespace, sys._getframe(1).f_globals)
    results = []
    with tqdm(parts, desc=find_lab(lab).split("_", 1)[0], unit="part", leave=False,
              disable=not progress) as bar:  # closed on Ctrl-C too
        for each in bar:
            bar.set_postfix_str(each.name)
            results.append(check_part(each, namespace, lab))
    return Report(find_lab(lab), tuple(results))


def progress(lab: str, part: str | None = None, *, namespace: dict | None = None,
             progress: bool = True) -> None:
    """Show which parts of `lab` pass their visible tests, with the checkers' messages."""
    if grading():  # the grader runs every test cell itself: this would run them twice
        print(f"gpulab.progress({lab!r}) skipped while grading: the grader runs the tests.")
        return
    namespace = _learner_namespace(namespace, sys._getframe(1).f_globals)
    report = run_self_checks(lab, part, namespace=namespace, progress=progress)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(report)
    else:
        print(report)


def _learner_namespace(namespace: dict | None, caller_globals: dict) -> dict:
    """`namespace` when given; else the notebook's variables (IPython's user namespace);
    else, outside IPython (a script), the caller's globals."""
    if namespace is not None:
        return namespace
    try:
        from IPython import get_ipython
    except ImportError:
        return caller_globals
    shell = get_ipython()
    return shell.user_ns if shell is not None else caller_globals


__all__ = ["PACKAGES", "FAIL", "NOT_DEFINED", "NOT_STARTED", "PASS", "PartResult", "Report",
           "check_part", "progress", "run_self_checks"]
