"""Is a learner's definition still the lab's stub? Read from the bytecode, so that it works for
code typed in a notebook cell, exec'd in a test, or compiled by @cuda.jit alike.

A released lab's stub is a function whose whole body is `raise NotImplementedError()` (after the
docstring), or a number left as None. A class is unfinished while any method of its own is still
such a stub (the lab gives some methods, like forward, ready-made).
"""

from __future__ import annotations

import dis
import inspect
import traceback

# What a learner reads wherever a stub was called (the checkers, the quiz, progress()).
STUB_HINT = "Replace `raise NotImplementedError()` with your code."

# Instructions around a call that say nothing about what the function does (CPython 3.10-3.13).
_PLUMBING = {"RESUME", "NOP", "CACHE", "PRECALL", "CALL", "PUSH_NULL", "EXTENDED_ARG",
             "COPY_FREE_VARS", "MAKE_CELL", "CALL_FUNCTION", "KW_NAMES"}


def is_stub_function(fn) -> bool:
    """True when `fn`'s body only raises NotImplementedError (a docstring and comments aside)."""
    code = getattr(fn, "__code__", None)
    return code is not None and is_stub_code(code)


def is_stub_code(code) -> bool:
    """is_stub_function for a code object (a frame's, in a traceback)."""
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _PLUMBING]
    loads = [op for op in ops if op[0] in ("LOAD_GLOBAL", "LOAD_NAME")]
    return (len(ops) == 2 and loads == [ops[0]] and ops[0][1] == "NotImplementedError"
            and ops[1][0] == "RAISE_VARARGS")


def is_stub_error(error: BaseException) -> bool:
    """True when `error` is a stub's NotImplementedError: raised by a function whose whole body
    is `raise NotImplementedError()` (a learner's function that is not started), not by a
    half-written one or by a library that lacks a feature."""
    if not isinstance(error, NotImplementedError):
        return False
    frames = list(traceback.walk_tb(error.__traceback__))
    return bool(frames) and is_stub_code(frames[-1][0].f_code)


def not_started(name: str, hint: str = STUB_HINT) -> str:
    """The message for a part whose function `name` is still the stub."""
    return f"{name} is not started: it raised NotImplementedError.\n{hint}"


def _python_function(obj):
    """The plain function behind a @cuda.jit kernel, a staticmethod or a classmethod."""
    for attr in ("py_func", "__func__"):
        inner = getattr(obj, attr, None)
        if inner is not None:
            return inner
    return obj


def unfinished(name: str, value) -> list[str]:
    """What is still the stub in the learner's `value` (named `name`): [] when nothing is;
    [name] for a None or a stub function; ["Cls.method", ...] for a class's stub methods."""
    if value is None:
        return [name]
    if inspect.isclass(value):
        own = vars(value)
        return [f"{name}.{attr}" for attr, member in own.items()
                if is_stub_function(_python_function(member))]
    return [name] if is_stub_function(_python_function(value)) else []
