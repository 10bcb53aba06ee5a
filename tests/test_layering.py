"""Imports run downward: a module imports from its own layer and the layers below it, never above.

LAYERS below is the rule, bottom to top. A module's layer is its longest matching entry ("pkg.*"
is the package and everything in it, a plain name is that module only), and every module of
gpulab/, autograder/ and benchmarks/ must have one, so a new module is placed on purpose. Two
rules cut across the layers: the lab packages are islands (none imports another), and the
grader never imports the checkers or progress() (NEVER). ALLOWED names the few upward imports
that are so by design, each with its reason. And no module takes another's underscore names
(`from m import _x`, `import m._x`, `m._x`): what a module shares, it names without one.

Imports are read with `ast`, not by importing: module-level and function-level, `import x` and
`from x import y` (y resolved to a module where it is one), relative imports resolved. Imports
made from strings (importlib, `python -m`, a subprocess) are not imports here: that is how the
registry reaches a lab package and how the grader runs the answer keys.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("gpulab", "autograder", "benchmarks")  # what this test reads; other imports are ignored
SCRIPT_DIRS = ("benchmarks",)  # run as scripts: `from common import Row` is benchmarks/common.py


@dataclass(frozen=True)
class Layer:
    """One layer of the import rule: what is in it, and why it sits where it does."""

    name: str
    modules: tuple[str, ...]  # "pkg.*": the package and all in it; "mod": that module only
    why: str
    separate: bool = False  # its entries are islands: none imports another


# Bottom to top. A module may import its own layer and every layer listed before it.
LAYERS = (
    Layer("foundation",
          ("gpulab", "gpulab.env", "gpulab.compat", "gpulab.simulator_fix", "gpulab.source",
           "gpulab.faces", "gpulab.stubs", "gpulab.gpu_specs", "gpulab.hardware", "gpulab.timing",
           "gpulab.cloud_instances", "gpulab.cloud_cost"),
          "what `import gpulab` loads (runner, simulator switch) and what every lesson stands on: "
          "spec sheets (GPUs, cloud machines), napkin maths, the timer, the stub detector; no "
          "torch at import"),
    Layer("kernels and simulator", ("gpulab.kernels.*", "gpulab.sim.*"),
          "the Numba kernels and the simulator's tracer: Numba and NumPy, nothing of the library"),
    Layer("library",
          ("gpulab.models", "gpulab.data", "gpulab.checkpoint", "gpulab.train", "gpulab.run_log",
           "gpulab.precision", "gpulab.viz", "gpulab.monitor", "gpulab.quiz.*",
           "gpulab.slow_pipeline", "gpulab.memory.*", "gpulab.profiling.*",
           "gpulab.distributed.*"),
          "what the lessons teach: training, precision, memory, profiling, distributed, pictures"),
    Layer("capstone library", ("gpulab.capstone.*",),
          "the capstone's run, assembled from the library; the library never reaches into it"),
    Layer("checks harness", ("gpulab.checks.table", "gpulab.checks.harness.*"),
          "the parts-and-points table and what every checker stands on; it knows no lab"),
    Layer("lab checks",
          ("gpulab.checks.lab1.*", "gpulab.checks.lab2.*", "gpulab.checks.lab3.*",
           "gpulab.checks.lab4.*", "gpulab.checks.lab5.*", "gpulab.checks.quiz.*",
           "gpulab.checks.capstone.*"),
          "one package per graded assignment; what two labs share goes down into the harness",
          separate=True),
    Layer("checks registry", ("gpulab.checks", "gpulab.checks.keys"),
          "finds a lab's package by name (importlib) and computes its answer keys"),
    Layer("tools", ("gpulab.self_check.*", "gpulab.explorers.*", "gpulab.doctor",
                    "gpulab.colab", "gpulab.__main__", "gpulab.quiz.__main__"),
          "what a person calls from a notebook or a shell: progress(), explorers, doctor, "
          "colab cells, a learner's quiz numbers and answers; nothing in the library imports "
          "them"),
    Layer("grader", ("autograder.*",),
          "nbgrader underneath, sandboxed kernels; it runs checkers only in the grading kernel "
          "or as a subprocess (see NEVER)"),
    Layer("benchmarks", ("benchmarks.*",), "measures anything against anything"),
)

# (importer, imported, why): forbidden whatever the layers say.
NEVER = (
    ("autograder.*", "gpulab.checks.*",
     "the grader never imports the checkers: they run in the grading kernel, and the answer "
     "keys in a process of their own (`python -m gpulab.checks.keys LAB`)"),
    ("autograder.*", "gpulab.self_check.*",
     "the grader never imports progress(): it runs every test cell itself"),
)

# (importer, imported, why): upward by design, and only these.
ALLOWED = (
    ("gpulab", "gpulab.self_check",
     "gpulab.progress is a lazy re-export in the package's __getattr__, loaded on first use so "
     "that `import gpulab` stays light"),
)


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return module == package or module.startswith(package + ".")
    return module == pattern


def _entry(module: str) -> tuple[int, str] | None:
    """(layer index, matching entry) of `module`, by its longest matching entry; None: no layer."""
    found = [(len(p), i, p) for i, layer in enumerate(LAYERS) for p in layer.modules
             if _matches(module, p)]
    if not found:
        return None
    _, index, pattern = max(found)
    return index, pattern


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))
            if "__pycache__" not in p.parts}


MODULES = _all_modules()


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute, resolved to the deepest module of the tree it names


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in `source` (module `module`) of a module in TREES, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [_local(alias.name, module) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package, up level - 1 packages
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = _local(node.module, module)
            # `from pkg import name`: the submodule pkg.name where there is one, else pkg itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        found += [Import(node.lineno, name) for name in dict.fromkeys(names)
                  if name.split(".")[0] in TREES]
    return found


def _local(name: str, importer: str) -> str:
    """A script's bare import of a sibling file (`from common import Row` in benchmarks/)."""
    folder = importer.split(".")[0]
    if folder in SCRIPT_DIRS and f"{folder}.{name.split('.')[0]}" in MODULES:
        return f"{folder}.{name}"
    return name


def broken_rule(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None where it may."""
    for low, high, _ in ALLOWED:
        if importer == low and (imported == high or imported.startswith(high + ".")):
            return None
    for who, whom, why in NEVER:
        if _matches(importer, who) and _matches(imported, whom):
            return f"never: {who} imports {whom}, {why}"
    place, target = _entry(importer), _entry(imported)
    if place is None or target is None:
        missing = importer if place is None else imported
        return f"{missing} has no layer: add it to LAYERS in tests/test_layering.py"
    (mine, my_entry), (theirs, their_entry) = place, target
    if theirs > mine:
        return (f"upward: {importer} is in '{LAYERS[mine].name}' (layer {mine + 1}), "
                f"{imported} in '{LAYERS[theirs].name}' (layer {theirs + 1}); a module imports "
                f"only its own layer and those below. Move what both need down, or the importer up")
    if theirs == mine and LAYERS[mine].separate and my_entry != their_entry:
        return (f"sideways: {my_entry} and {their_entry} are separate packages of "
                f"'{LAYERS[mine].name}' ({LAYERS[mine].why})")
    return None


def violations(source: str, module: str, filename: str, is_package: bool = False) -> list[str]:
    """One line per import in `source` that breaks a rule: file, line, imported module, rule."""
    found = [f"{filename}:{imp.line}: imports {imp.module}: {rule}"
             for imp in imports_of(source, module, is_package)
             if (rule := broken_rule(module, imp.module))]
    return found + [f"{filename}:{line}: imports {name}: private, an underscore name of another "
                    "module; name it without the underscore where it is shared"
                    for line, name in private_names_taken(source, module)]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node) -> str | None:
    """`a.b.c` of an attribute chain on a plain name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_names_taken(source: str, module: str) -> list[tuple[int, str]]:
    """(line, name) for each underscore name `source` (module `module`) takes from another
    module of TREES: `from m import _x`, `import m._x`, or `m._x` where m is an imported module."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in TREES:
                    continue
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0])
                if any(map(_private, alias.name.split("."))):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] in TREES:
            for alias in node.names:
                if _private(alias.name) or any(map(_private, node.module.split("."))):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
                elif f"{node.module}.{alias.name}" in MODULES:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        head, _, rest = (_dotted(node.value) or "").partition(".")
        target = ".".join(filter(None, [bound.get(head), rest]))
        if head in bound and target in MODULES and target != module:
            found.append((node.lineno, f"{target}.{node.attr}"))
    return sorted(set(found))


# ---------------------------------------------------------------------------- the tree itself


def test_every_module_has_a_layer():
    unplaced = [name for name in MODULES if _entry(name) is None]
    assert not unplaced, f"modules with no layer (add them to LAYERS): {unplaced}"


def test_every_layer_entry_names_something():
    stale = [p for layer in LAYERS for p in layer.modules
             if not any(_matches(m, p) for m in MODULES)]
    stale += [low for low, _, _ in ALLOWED if low not in MODULES]
    assert not stale, f"entries of LAYERS or ALLOWED that match no module: {stale}"


def test_no_module_imports_upward():
    found = []
    for name, path in MODULES.items():
        found += violations(path.read_text(), name, str(path.relative_to(ROOT)),
                            is_package=path.name == "__init__.py")
    assert not found, "imports that break the layering:\n" + "\n".join(found)


def loaded_by(code: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running `code`."""
    run = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\n"
                          "print(json.dumps(sorted(sys.modules)))"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


def test_importing_gpulab_distributed_loads_no_torch():
    # The package faces name their modules' names and import them on first use.
    loaded = loaded_by("import gpulab.distributed, gpulab.distributed.runtime")
    heavy = [m for m in loaded if m.split(".")[0] == "torch"]
    assert not heavy, f"`import gpulab.distributed` loaded {heavy[:5]}: keep its face lazy"


# Teaching modules that launch ranks for their demonstrations; no other one imports the runtime.
LAUNCHING = ("gpulab.distributed.collectives", "gpulab.distributed.zero")


def test_only_the_teaching_modules_that_launch_import_the_runtime():
    runtime = "gpulab.distributed.runtime"
    teaching = [name for name in MODULES if name.startswith("gpulab.distributed.")
                and not _matches(name, runtime + ".*")]
    importers = sorted(name for name in teaching if any(
        _matches(imp.module, runtime + ".*")
        for imp in imports_of(MODULES[name].read_text(), name)))
    assert importers == sorted(LAUNCHING), importers


# Files run by path (`python FILE`): their folder comes first on sys.path, so a module beside
# them named like a standard-library module would be imported in its place.
RUN_BY_PATH = ("gpulab/distributed/runtime/node_client.py",)


def test_no_module_beside_a_file_run_by_path_shadows_the_standard_library():
    for script in RUN_BY_PATH:
        folder = (ROOT / script).parent
        shadows = [p.name for p in folder.glob("*.py") if p.stem in sys.stdlib_module_names]
        assert not shadows, f"{shadows} beside {script} shadow the standard library: rename them"


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circles():
    # Function-level imports count: a circle of them is one module that needs rethinking.
    graph = {name: {imp.module for imp in imports_of(path.read_text(), name,
                                                      path.name == "__init__.py")
                    if imp.module in MODULES and imp.module != name}
             for name, path in MODULES.items()}
    assert not import_circles(graph), import_circles(graph)


def test_circles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_importing_the_checks_loads_neither_torch_nor_numba():
    # What progress() and the grader's answer-key process read first must stay light.
    loaded = loaded_by("import gpulab.checks, gpulab.checks.table, gpulab.checks.keys")
    heavy = [m for m in loaded if m.split(".")[0] in ("torch", "numba")]
    assert not heavy, f"`import gpulab.checks` loaded {heavy[:5]}: import them inside checkers"


# ------------------------------------------------ the checker catches what it is meant to catch

BREAKING = [
    # (importer, source, the line, the imported module, a word of the rule)
    ("gpulab.hardware", "import os\nimport gpulab.checks.lab1\n", 2, "gpulab.checks.lab1",
     "upward"),
    ("gpulab.memory.estimate", "def f():\n    from gpulab.self_check import progress\n", 2,
     "gpulab.self_check", "upward"),
    ("gpulab.checks.harness.training", "from gpulab.checks.lab2 import amp_step\n", 1,
     "gpulab.checks.lab2.amp_step", "upward"),
    ("gpulab.checks.lab3.ring", "from ..lab5 import shared\n", 1, "gpulab.checks.lab5.shared",
     "sideways"),
    ("autograder.grade", "def g():\n    from gpulab.checks.keys import answer_key\n", 2,
     "gpulab.checks.keys", "never"),
    ("gpulab.models", "from . import capstone\n", 1, "gpulab.capstone", "upward"),
    ("gpulab.distributed.runtime.cluster",
     "from gpulab.distributed.runtime.torchrun import _timeout\n", 1,
     "gpulab.distributed.runtime.torchrun._timeout", "private"),
    ("gpulab.distributed.runtime.launch",
     "from gpulab.distributed.runtime import processes\nprocesses._tree(1)\n", 2,
     "gpulab.distributed.runtime.processes._tree", "private"),
    ("gpulab.distributed.runtime.launch",
     "def f():\n    import gpulab.distributed.runtime.processes as p\n    p._reap([])\n", 3,
     "gpulab.distributed.runtime.processes._reap", "private"),
]


@pytest.mark.parametrize("importer, source, line, imported, rule", BREAKING)
def test_checker_catches_a_made_up_import(importer, source, line, imported, rule):
    found = violations(source, importer, "made_up.py")
    assert len(found) == 1, found
    assert found[0].startswith(f"made_up.py:{line}: imports {imported}: {rule}"), found[0]


@pytest.mark.parametrize("importer, source", [
    ("gpulab.checks.harness.owned", "from gpulab.env import detect\nimport gpulab\n"),
    ("gpulab.checks.lab3.ring", "from . import ranks\nfrom ..harness import calls\n"),
    ("gpulab", "def __getattr__(name):\n    from gpulab.self_check import progress\n"),
    ("benchmarks.bench_ddp", "from common import Row\nfrom autograder.grade import grade\n"),
    ("autograder.profiles", "from gpulab.env import nvidia_gpu_count\nimport numpy\n"),
    ("gpulab.distributed.runtime.processes", "def _tree():\n    pass\n_tree()\nself._x = 1\n"),
    ("gpulab.distributed.runtime.launch", "import os\nos._exit(1)\n"),
])
def test_checker_lets_downward_imports_pass(importer, source):
    assert violations(source, importer, "made_up.py") == []


def test_relative_imports_resolve_from_the_package():
    found = imports_of("from . import ranks\nfrom .shared import run\nfrom .. import table\n",
                       "gpulab.checks.lab5", is_package=True)
    assert [i.module for i in found] == [
        "gpulab.checks.lab5.ranks", "gpulab.checks.lab5.shared", "gpulab.checks.table"]
