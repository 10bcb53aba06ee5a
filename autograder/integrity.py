"""The integrity guard: a snapshot of the test machinery taken in the grading kernel before any
learner cell runs, and a check against it before and after every test cell.

    grader (autograder/execute.py)                      grading kernel (this file, exec'd there)
    install_expression(config)  -- user_expressions --> install(config): Guard, the snapshot
    check_expression(token, names, phase) -----------> Guard.check: (token, findings)
    read_answer(reply, token) -> findings, [] when nothing changed

User expressions are evaluated by a plain `eval`, past every input and AST transformer; the
expression reaches the guard through `object`'s subclasses, naming nothing a learner's cell
could rebind, and the guard's code uses a copy of the builtins taken at install. The snapshot
holds identities (compared with `is`) of:

    builtins         every name: isinstance, len, abs, AssertionError, __import__, getattr...
    checkers         sys.modules entries, functions, their __code__, classes and methods of
                     every loaded gpulab module, numpy, numpy.testing, torch, torch.cuda and
                     the clocks (`time`, `resource`) (tests using gpulab)
    library data     the plain values of every loaded gpulab module and of its classes (GPU
                     spec sheets, memory recipes, presets, tolerances), by their repr: a frozen
                     dataclass edited with object.__setattr__, or a table edited in place,
                     reads differently
    IPython          the shell's parts and methods, the kernel's, the input and AST transformer
                     lists, the event callbacks (pre_run_cell, pre_execute, ...)
    hooks            sys.gettrace/getprofile, threading's trace and profile hooks, sys.stdout,
                     sys.stderr, sys.excepthook, sys.displayhook, sys.modules
    the lab's names  what the lab's locked cells define and the tests read (a checker written
                     in the notebook), and the globals those functions use
and a test cell's names must not shadow a builtin (`isinstance = lambda *a: True`). What IPython
or matplotlib add themselves (`%matplotlib inline`) is allowed. After a test the guard drops
what the kernel kept of it (linecache, the last traceback); the executor keeps tests out of
IPython's history. The kernel also caps each cell's output, so that a flood never reaches the
grader as one huge message.

What it cannot catch: code in the kernel's process can defeat a guard living there with enough
effort (edit objects in place with ctypes, replace the guard's methods and fake its answer,
keep a test's frames or constants while a checker calls it, patch a module the snapshot does
not list, such as numba, or a gpulab module first imported after the snapshot, by a checker's
own lazy import). The guard turns tampering from a one-liner into deliberate work; the sandbox
(autograder/sandbox.py) bounds what deliberate work can reach. Expected answers do not rely on
it: the grader writes them into the test cells (autograder/answers.py).
"""

from __future__ import annotations

import ast
import builtins
import dis
import linecache
import os
import sys
import threading

GUARD_FLAG = "_gpulab_integrity_guard_"
FIND_GUARDS = (
    "[c.instance for c in ().__class__.__base__.__subclasses__() "
    f"if c.__dict__.get({GUARD_FLAG!r}) is True]"
)
MAX_FINDINGS = 12  # a mass patch would list hundreds of names; a dozen says enough
LIBRARY_PACKAGES = ("IPython", "ipykernel", "matplotlib_inline", "ipywidgets", "matplotlib")
SHELL_PARTS = (
    "user_ns", "user_global_ns", "events", "input_transformer_manager", "compile", "displayhook",
    "display_pub", "display_formatter", "history_manager", "kernel", "builtin_trap",
    "display_trap", "custom_exceptions", "InteractiveTB", "SyntaxTB",
)
TRANSFORMER_LISTS = {
    "input_transformers_cleanup": lambda shell: shell.input_transformer_manager.cleanup_transforms,
    "input line transformers": lambda shell: shell.input_transformer_manager.line_transforms,
    "input token transformers": lambda shell: shell.input_transformer_manager.token_transformers,
    "input_transformers_post": lambda shell: shell.input_transformers_post,
    "ast_transformers": lambda shell: shell.ast_transformers,
}
SYS_PARTS = ("stdout", "stderr", "excepthook", "displayhook", "modules")
# torch imports torch._dynamo lazily (an optimizer step, torch.compile), which rewraps these with
# its "disable" decorator, keeping the original as __wrapped__: a change, but not tampering.
TORCH_REWRAPS = {("torch", "manual_seed")}
METHOD_KINDS = (type(lambda: 0), staticmethod, classmethod, property)
MISSING = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
# A changed plain value of a gpulab module is marked so, and the grader's message then states
# the rule it breaks (docs/maintainers.md): a learner's edit, or a library module keeping state.
DATA_MARK = " (library data)"
DATA_RULE = ("No gpulab module may hold a module-level value that changes as a notebook runs: "
             "its plain values are the checkers' data (docs/maintainers.md, \"No mutable "
             "module-level values\"); keep changing state in a private class or a function.")


# ----------------------------------------------------------------------------- in the kernel


class Guard:
    """The snapshot and the check: one per grading kernel, found by FIND_GUARDS."""

    _gpulab_integrity_guard_ = True
    instance = None

    def __init__(self, shell, config: dict):
        self.shell = shell
        self.builtins = dict(vars(builtins))
        self.probes = []  # (what, read, value at install, same or None for `is`)
        self.library_dirs = _library_dirs()
        self.output_limit = int(config["output_limit"])
        self.written = 0  # characters of output from the cell running now
        self.linecache_mark = frozenset()
        self._cap_output()  # first: the wrappers and their callback are part of the snapshot
        live = vars(builtins)
        for name in self.builtins:
            self.watch(f"builtins.{name}", lambda n=name: live.get(n, MISSING))
        self._watch_modules(config["watch"], config.get("data", ()))
        self._watch_ipython()
        self.watch("sys.settrace hook", sys.gettrace)
        self.watch("sys.setprofile hook", sys.getprofile)
        for hook in ("_trace_hook", "_profile_hook"):
            self.watch(f"threading.{hook}", lambda h=hook: getattr(threading, h, None))
        for part in SYS_PARTS:
            self.watch(f"sys.{part}", lambda p=part: getattr(sys, p))

    def watch(self, what: str, read, same=None) -> None:
        self.probes.append((what, read, _read(read), same))

    def check(self, token: str, names=(), phase: str = "before") -> tuple:
        """(token, findings): what changed since install, and builtins that `names` shadow."""
        found = [what for what, read, want, same in self.probes
                 if not (same(_read(read), want) if same else _read(read) is want)]
        user_ns = self.shell.user_ns
        found += [f"{name} (a builtin, redefined in the notebook)" for name in names
                  if name in self.builtins and not name.startswith("__")
                  and user_ns.get(name, self.builtins[name]) is not self.builtins[name]]
        if phase == "after":
            self._forget()
        self.linecache_mark = frozenset(linecache.cache)
        if len(found) > MAX_FINDINGS:
            found = found[:MAX_FINDINGS] + [f"{len(found) - MAX_FINDINGS} more"]
        return token, tuple(found)

    def protect(self, names) -> int:
        """Watch `names` of the notebook (set by a lab's own cell) and the globals they use."""
        user_ns = self.shell.user_ns
        for name in names:
            value = user_ns.get(name, MISSING)
            if value is MISSING:
                continue
            self.watch(f"{name} (set by the lab)", lambda n=name: user_ns.get(n, MISSING))
            for used in sorted(_globals_used(value)):
                if used in user_ns or used in self.builtins:  # absent now: a builtin's name
                    self.watch(f"{used} (used by {name})",
                               lambda u=used: user_ns.get(u, MISSING))
        return len(self.probes)

    # -- what the snapshot covers

    def _watch_modules(self, patterns, data_patterns=()) -> None:
        modules = sys.modules
        for name, module in sorted(modules.items()):
            if module is None or not any(_matches(name, p) for p in patterns):
                continue
            self.watch(f"sys.modules[{name!r}]", lambda n=name: modules.get(n))
            self._watch_namespace(name, vars(module), name)
            if any(_matches(name, p) for p in data_patterns):
                self._watch_data(name, vars(module), name)

    def _watch_data(self, prefix: str, namespace, module: str) -> None:
        """Each plain value of a module (and of the classes it defines), by its repr."""
        for key, value in list(namespace.items()):
            if key.startswith("__") or isinstance(value, type(sys)):
                continue
            if isinstance(value, type):  # a public class's tables; private ones keep registries
                if value.__module__ == module and prefix == module and not key.startswith("_"):
                    self._watch_data(f"{prefix}.{key}", vars(value), module)
                continue
            if callable(value) or isinstance(value, METHOD_KINDS):
                continue
            self.watch(f"{prefix}.{key}{DATA_MARK}",
                       lambda d=namespace, k=key: _fingerprint(d.get(k, MISSING)), _equal)

    def _watch_namespace(self, prefix: str, namespace, module: str) -> None:
        for key, value in list(namespace.items()):
            if not (callable(value) or isinstance(value, METHOD_KINDS)):
                continue
            same = _same_or_rewrapped_by_torch if (prefix, key) in TORCH_REWRAPS else None
            self.watch(f"{prefix}.{key}", lambda d=namespace, k=key: d.get(k, MISSING), same)
            if hasattr(value, "__code__"):
                self.watch(f"{prefix}.{key}.__code__", lambda f=value: f.__code__)
            if isinstance(value, type) and value.__module__ == module and prefix == module:
                self._watch_namespace(f"{prefix}.{key}", vars(value), module)

    def _watch_ipython(self) -> None:
        shell = self.shell
        self.watch("IPython shell class", lambda: type(shell))
        for part in SHELL_PARTS:
            self.watch(f"IPython shell.{part}", lambda p=part: getattr(shell, p))
        for what, get in TRANSFORMER_LISTS.items():
            self.watch(what, lambda g=get: tuple(g(shell)), self._same_members)
        callbacks = shell.events.callbacks
        for event in list(callbacks):
            self.watch(f"{event} callbacks", lambda e=event: tuple(callbacks.get(e, ())),
                       self._same_members)
        parts = ("shell", shell), ("kernel", shell.kernel), ("compiler", shell.compile), (
            "input transformer manager", shell.input_transformer_manager), (
            "display publisher", shell.display_pub), ("display hook", shell.displayhook)
        for what, obj in parts:
            methods = set()
            for cls in type(obj).__mro__[:-1]:
                methods.update(k for k, v in vars(cls).items() if isinstance(v, METHOD_KINDS))
                self._watch_namespace(cls.__name__, vars(cls), cls.__module__)
            # `shell.run_cell = fake` hides the class's method behind an instance attribute
            self.watch(f"IPython {what} methods set on the instance",
                       lambda o=obj, m=frozenset(methods): frozenset(m & set(vars(o))),
                       lambda now, want: now == want)

    def _same_members(self, now, want) -> bool:
        """A list kept its members; anything added comes from IPython or a plotting library."""
        if not isinstance(now, tuple):
            return False
        kept = all(any(x is y for x in now) for y in want)
        return kept and all(any(x is y for y in want) or self._from_library(x) for x in now)

    def _from_library(self, obj) -> bool:
        try:
            codes = _code_objects(obj)
            files = [os.path.realpath(code.co_filename) for code in codes]
        except Exception:  # a learner's object with odd attributes is not the library's
            return False
        return bool(files) and all(
            any(f.startswith(d + os.sep) for d in self.library_dirs) for f in files)

    # -- output caps and forgetting tests

    def _cap_output(self) -> None:
        """Drop a cell's output past output_limit characters, in the kernel: one flooding cell
        would otherwise become a single message of hundreds of MB on the grader's side."""
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "session") and hasattr(stream, "write"):  # ipykernel's OutStream
                stream.write = self._capped(stream.write, len)
                self.watch("the output cap", lambda s=stream: vars(s).get("write", MISSING))
        publisher = self.shell.display_pub
        publisher.publish = self._capped(publisher.publish, _data_size)
        self.shell.events.register("pre_execute", self._new_cell)

    def _capped(self, send, size):
        def capped(data, *args, **kwargs):
            self.written += size(data)
            if self.written <= self.output_limit:
                return send(data, *args, **kwargs)
            return len(data) if isinstance(data, str) else None

        return capped

    def _new_cell(self) -> None:
        self.written = 0

    def _forget(self) -> None:
        """Drop what the kernel kept of the test cell that just ran."""
        for key in [k for k in linecache.cache if k not in self.linecache_mark]:
            linecache.cache.pop(key, None)
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        self.shell._last_traceback = None
        if hasattr(self.shell.InteractiveTB, "tb"):
            self.shell.InteractiveTB.tb = None


def install(config: dict) -> tuple:
    """Import what the tests use, take the snapshot; returns a first check (nothing changed)."""
    import importlib

    from IPython import get_ipython

    for name in config["imports"]:
        try:
            module = importlib.import_module(name)
            # A lazy package face (gpulab/faces.py) names its modules in MODULES and imports
            # them on first use: import them now, so that they are in the snapshot.
            for behind in getattr(module, "MODULES", ()):
                importlib.import_module(behind)
        except ImportError:  # the test that imports it fails, and says why
            pass
    Guard.instance = Guard(get_ipython(), config)
    return Guard.instance.check(config["token"])


def _fingerprint(value) -> str:
    """What a plain value holds, as text: its repr (an array's bytes, which repr abbreviates)."""
    tobytes = getattr(value, "tobytes", None)
    if callable(tobytes) and hasattr(value, "dtype"):
        return f"{type(value).__name__} {value.dtype} {getattr(value, 'shape', '')} " \
               f"{hash(tobytes())}"
    return repr(value)


def _equal(now, before) -> bool:
    return now == before


def _read(read):
    try:
        return read()
    except Exception:
        return MISSING


def _matches(name: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        return name == pattern[:-2] or name.startswith(pattern[:-1])
    return name == pattern


def _data_size(data) -> int:
    return sum(len(v) for v in data.values() if isinstance(v, str)) if isinstance(data, dict) else 0


def _library_dirs() -> list[str]:
    from importlib.util import find_spec

    dirs = []
    for package in LIBRARY_PACKAGES:
        spec = find_spec(package)
        dirs += [os.path.realpath(d) for d in (spec and spec.submodule_search_locations) or ()]
    return dirs


def _code_objects(obj) -> list:
    """The code behind a callable: a function's, a bound method's, a partial's, or the methods
    of an object's own class (an ast.NodeTransformer, a callable instance)."""
    fn = getattr(obj, "__func__", obj)
    if hasattr(fn, "__code__"):
        return [fn.__code__]
    inner = getattr(obj, "func", None)
    if inner is not None and inner is not obj:
        return _code_objects(inner)
    return [v.__code__ for v in vars(type(obj)).values() if hasattr(v, "__code__")]


def _globals_used(value) -> set[str]:
    """Global names a function (or a class's methods) reads, nested functions included."""
    functions = [value] if hasattr(value, "__code__") else (
        [v for v in vars(value).values() if hasattr(v, "__code__")]
        if isinstance(value, type) else [])
    codes, names = [f.__code__ for f in functions], set()
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if hasattr(c, "co_code")]
        names.update(ins.argval for ins in dis.get_instructions(code)
                     if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"))
    return names


# ----------------------------------------------------------------------------- in the grader


def install_expression(config: dict) -> str:
    """An expression that runs this file in the kernel and installs the guard."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    # The guard's own builtins: a copy, so that a later patch of `len` does not reach its code.
    namespace = "{'__name__': '_gpulab_guard', '__builtins__': dict(vars(__import__('builtins')))}"
    return (f"[(lambda ns: (exec(compile({source!r}, '<gpulab integrity guard>', 'exec'), ns), "
            f"ns['install']({config!r}))[1])({namespace})]")


def check_expression(token: str, names=(), phase: str = "before") -> str:
    return f"[g.check({token!r}, {tuple(names)!r}, {phase!r}) for g in {FIND_GUARDS}]"


def protect_expression(names) -> str:
    return f"[g.protect({tuple(names)!r}) for g in {FIND_GUARDS}]"


def read_answer(content: dict | None, token: str, key: str = "guard") -> list[str]:
    """The findings in an execute_reply's user_expressions; an odd answer is itself a finding."""
    if content is None:
        return ["the kernel did not answer the integrity check"]
    if content.get("status") != "ok":  # the empty cell failed: an input transformer raised?
        return [f"the integrity check could not run ({content.get('ename', 'error')})"]
    answer = content.get("user_expressions", {}).get(key, {})
    if answer.get("status") != "ok":
        why = f"{answer.get('ename', '?')}: {str(answer.get('evalue', ''))[:200]}"
        return [f"the integrity guard is missing or broken ({why})"]
    try:
        value = ast.literal_eval(answer["data"]["text/plain"])
    except (KeyError, TypeError, ValueError, SyntaxError, MemoryError, RecursionError):
        return ["the integrity guard's answer is unreadable"]
    genuine = (isinstance(value, list) and len(value) == 1 and isinstance(value[0], tuple)
               and len(value[0]) == 2 and value[0][0] == token
               and isinstance(value[0][1], tuple))
    if not genuine:
        return ["the integrity guard's answer is not genuine"]
    return [str(finding) for finding in value[0][1]]


def _same_or_rewrapped_by_torch(now, before) -> bool:
    """True for the same object, or for torch._dynamo's wrapper around it (see TORCH_REWRAPS)."""
    if now is before:
        return True
    code = getattr(now, "__code__", None)
    return (getattr(now, "__wrapped__", None) is before and code is not None
            and code.co_filename.replace("\\", "/").endswith("torch/_compile.py"))
