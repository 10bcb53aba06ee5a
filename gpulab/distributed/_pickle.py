"""Pickle functions and classes defined in a notebook, so that other processes can run them.

Plain `pickle` saves a function as a reference, "module.qualname", and the other process imports
it. That fails for what a notebook defines: its module is `__main__`, and a fresh rank process
has a different `__main__`. cloudpickle saves those *by value* (code, the globals it uses,
closure, defaults) and everything importable by reference, as plain pickle does.

What this module adds is the message when something cannot travel: it names the notebook global
at fault (an open file, a lock, a CUDA stream), which is what a learner needs to fix it.
A notebook global travels as a copy taken at launch time: a rank that changes it changes its own
copy, and the notebook never sees it (return values instead).
"""

from __future__ import annotations

import pickle
import types

import cloudpickle


def dumps(obj) -> bytes:
    """cloudpickle.dumps, with an error that names the global that cannot be sent."""
    try:
        return cloudpickle.dumps(obj)
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
