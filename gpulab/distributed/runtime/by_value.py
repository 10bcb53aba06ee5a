"""Pickle functions and classes defined in a notebook, so that other processes can run them.

Plain `pickle` saves a function as a reference, "module.qualname", and the other process imports
it. That fails for what a notebook defines: its module is `__main__`, and a fresh rank process
has a different `__main__`. cloudpickle saves those *by value* (code, the globals it uses,
closure, defaults) and everything importable by reference, as plain pickle does.

What this module adds is the message when something cannot travel: it names the notebook global
at fault (an open file, a lock, a CUDA stream), which is what a learner needs to fix it.
A notebook global travels as a copy taken at launch time: a rank that changes it changes its own
copy, and the notebook never sees it (return values instead).

Code sent by value keeps its file name. cloudpickle 3.1.3 renames it "<dynamic-code>" (so that
payloads are deterministic); a traceback or stack dump on a rank could then no longer point at
the learner's cell, which is what the labs' messages quote.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap

import cloudpickle

RENAMED = "<dynamic-code>"


def _code_keeping_its_file(code: types.CodeType):
    constructor, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return constructor, tuple(code.co_filename if a == RENAMED else a for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_keeping_its_file},
                              cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    """cloudpickle.dumps, with an error that names the global that cannot be sent."""
    try:
        with io.BytesIO() as file:
            _Pickler(file).dump(obj)
            return file.getvalue()
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise pickle.PicklingError(_explain(obj, error)) from error


def loads(data: bytes):
    """pickle.loads (cloudpickle's output is plain pickle data)."""
    return pickle.loads(data)


def _names_in(code: types.CodeType) -> set[str]:
    """Every global name the code (and the code of functions nested in it) may look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def _explain(obj, error: Exception) -> str:
    """Say which notebook global could not travel, and what to do about it."""
    culprits = []
    if isinstance(obj, types.FunctionType):
        wanted = _names_in(obj.__code__)
        for key, value in obj.__globals__.items():
            if key in wanted and not isinstance(value, types.ModuleType):
                try:
                    cloudpickle.dumps(value)
                except Exception as inner:  # noqa: BLE001 - we only collect the names
                    culprits.append(f"`{key}` ({type(value).__name__}: {inner})")
    what = f"`{getattr(obj, '__qualname__', type(obj).__name__)}`"
    if culprits:
        return (f"{what} uses the global {', '.join(culprits)}, which cannot be sent to another "
                "process. Create it inside the function, or pass something picklable as an "
                "argument instead.")
    return (f"{what} (or one of its arguments) cannot be sent to another process: {error}. "
            "Arguments and return values must be picklable (tensors, numbers, lists, dicts).")
