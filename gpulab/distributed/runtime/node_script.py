"""Notebook code as a script: the source of the learner's functions and classes, and of what
they use from the notebook, written out so that every node of a cluster can run it.

    text = script_of({"pp_tp_step": pp_tp_step, "TPMLP": TPMLP}, prelude=PRELUDE, main=MAIN)
    Path("train.py").write_text(text)         # then: torchrun ... train.py

A multi-node job runs a file on every node: nothing from a notebook's memory travels with it.
So the checker copies each graded object's source, found the way inspect does for a function
(the code object's file and line, read through linecache, where IPython keeps every cell it
ran), and adds what those sources name from the notebook: its other functions and classes (their
sources too), its modules (`import numpy as np`), names imported from a library (`from x import
y`) and plain constants (`N = 4`). Everything else (tensors, models, open files) stays behind:
a script must build its own. Definitions come after what they name, so that a class's base
class exists when the class statement runs.

An object whose source cannot be found (made by exec, or in a cell whose text is gone) is
refused with SourceNotFound: grading it would grade something else.
Used by: gpulab/checks/lab5/pp_tp_cluster.py (Lab 5, Part 4) and gpulab/capstone/launch.py
"""

from __future__ import annotations

import ast
import builtins
import linecache
import types

_SIMPLE = (bool, int, float, complex, str, bytes, type(None))


class SourceNotFound(LookupError):
    """The source of a notebook object could not be read back."""


def _code_objects(obj) -> list[types.CodeType]:
    """The code of a function, or of the functions defined in a class's body."""
    obj = getattr(obj, "__wrapped__", obj)
    if isinstance(obj, types.FunctionType):
        return [obj.__code__]
    codes = []
    for attr in vars(obj).values() if isinstance(obj, type) else ():
        for fn in (getattr(attr, "__func__", attr), getattr(attr, "fget", None)):
            if isinstance(fn, types.FunctionType):
                codes.append(fn.__code__)
    return codes


def _globals_of(obj) -> dict:
    obj = getattr(obj, "__wrapped__", obj)
    if isinstance(obj, types.FunctionType):
        return obj.__globals__
    for attr in vars(obj).values() if isinstance(obj, type) else ():
        fn = getattr(attr, "__func__", attr)
        if isinstance(fn, types.FunctionType):
            return fn.__globals__
    module = __import__("sys").modules.get(getattr(obj, "__module__", ""), None)
    return vars(module) if module is not None else {}


def source_of(obj, name: str) -> str:
    """The text of the top-level `def` or `class` statement that made obj (decorators
    included), from the file or notebook cell it was written in."""
    for code in _code_objects(obj):
        lines = linecache.getlines(code.co_filename)
        if not lines:
            continue
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.name == obj.__name__ and first <= code.co_firstlineno <= node.end_lineno:
                return "".join(lines[first - 1:node.end_lineno])
    raise SourceNotFound(
        f"the source of {name} ({getattr(obj, '__qualname__', obj)!r}) cannot be found: the "
        f"cluster's script is made of your code's text, so define {name} with a `def` or "
        "`class` statement at the top level of a notebook cell (not through exec, not inside "
        "another function) and run that cell again.")


def _names_used(source: str) -> list[str]:
    """The names a statement reads (in order of appearance, without repeats)."""
    seen: dict[str, None] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            seen.setdefault(node.id, None)
    return list(seen)


def _is_simple(value) -> bool:
    if isinstance(value, tuple | frozenset):
        return all(_is_simple(v) for v in value)
    return isinstance(value, _SIMPLE)


class _Script:
    """The lines of a script, built by visiting objects depth first."""

    def __init__(self, predefined: set[str]):
        self.imports: list[str] = []
        self.constants: list[str] = []
        self.definitions: list[str] = []
        self.defined = set(predefined)  # names the script already has
        self.visited: set[int] = set()  # ids of the notebook objects whose source is in

    def add(self, obj, name: str) -> None:
        """obj's source and what it needs, bound to `name` in the script."""
        if id(obj) not in self.visited:
            source = source_of(obj, name)
            self.visited.add(id(obj))
            namespace = _globals_of(obj)
            for used in _names_used(source):
                if used not in self.defined and used != obj.__name__:
                    self._add_name(used, namespace, obj)
            self.definitions.append(source.rstrip() + "\n")
            self.defined.add(obj.__name__)
        if name != obj.__name__ and name not in self.defined:
            self.definitions.append(f"{name} = {obj.__name__}\n")
            self.defined.add(name)

    def _add_name(self, name: str, namespace: dict, user) -> None:
        if name not in namespace:
            return  # a builtin, a local variable, or a name the notebook never bound
        value = namespace[name]
        home = getattr(user, "__module__", None)
        if isinstance(value, types.ModuleType):
            module = value.__name__
            line = f"import {module}" if module == name else f"import {module} as {name}"
            self.imports.append(line)
        elif isinstance(value, type | types.FunctionType) and getattr(
                value, "__module__", None) == home:
            try:  # the notebook's own: its source, and what that uses
                self.add(value, name)
            except SourceNotFound:
                pass  # perhaps a local variable's name; if it was needed, the run says so
            return
        elif callable(value) and _importable(value):
            what = value.__qualname__
            self.imports.append(f"from {value.__module__} import {what}"
                                + (f" as {name}" if name != what else ""))
        elif _is_simple(value):
            self.constants.append(f"{name} = {value!r}")
        else:
            return  # data (a tensor, a model...): a script builds its own
        self.defined.add(name)

    def text(self) -> str:
        parts = []
        if self.imports:
            parts.append("\n".join(dict.fromkeys(self.imports)) + "\n")
        if self.constants:
            parts.append("\n".join(self.constants) + "\n")
        parts += self.definitions
        return "\n\n".join(parts)


def _importable(value) -> bool:
    """A function or class that a script can import by its module and name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or "." in qualname:
        return False
    imported = __import__("sys").modules.get(module)
    return imported is not None and getattr(imported, qualname, None) is value


def script_of(objects: dict, prelude: str = "", main: str = "") -> str:
    """A script: the prelude, then the sources of `objects` ({name in the script: object}) and
    of what they use from their notebook, then main. SourceNotFound when a source is missing."""
    # The prelude's names are not taken for granted: where the notebook binds one to something
    # else (its own split_gpt, say), the notebook's binding comes after and wins.
    script = _Script(set(dir(builtins)))
    for name, obj in objects.items():
        script.add(obj, name)
    body = script.text()
    return "\n\n".join(part.strip("\n") + "\n" for part in (prelude, body, main) if part)

