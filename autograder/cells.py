"""A submitted notebook's cells as grading sees them, and what grading tells the instructor.

    admit_submission(submitted, source)     before nbgrader: notebooks that cannot be read,
                                            cells handed in twice, test cells deleted
    Plan.of(nb)                             before running: each cell's role (a test, the lab's
                                            own setup, the learner's), what the tests read
    Record                                  while running: flags and per-cell reasons

Roles come from nbgrader's metadata, after autograde has restored it from the lab's source
(OverwriteCells), so a learner cannot turn a test into an ordinary cell or the reverse.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

# Test cells that import from gpulab are graded by its checkers: the guard imports and watches
# these, and what they compare with, before any learner cell runs: every loaded gpulab module
# (its functions, classes and its data: spec sheets, recipes, tolerances), not a list of them.
# The training checkers compare with torch (torch.equal, F.cross_entropy, Tensor methods); Lab 4's
# measure memory (gpulab.memory) and time (the clock, the slow pipeline they race against).
CHECKER_MODULES = ("gpulab.checks", "gpulab.sim", "numpy.testing", "torch", "torch.nn.functional")
CHECKER_WATCH = ("gpulab.*", "numpy", "numpy.testing", "torch", "torch.nn.functional",
                 "torch.cuda", "time", "resource")
CHECKER_DATA = ("gpulab.*",)  # modules whose plain values (not only functions) are watched


@dataclass
class Record:
    """What the instructor should hear about one notebook: flags by kind, reasons by cell."""

    flags: dict[str, list[str]] = field(default_factory=dict)  # "timeout" -> ["test_mean"]
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (cell, what happened)

    def note(self, kind: str | None, item: str, reason: str | None = None) -> None:
        if kind is not None and item not in self.flags.setdefault(kind, []):
            self.flags[kind].append(item)
        if reason is not None:
            self.reasons.append((item, reason))

    def flag_lines(self) -> list[str]:
        """"tampered: builtins.isinstance, ast_transformers": one per kind, no ';' (the CSV's
        separator of flags)."""
        return [f"{kind}: {', '.join(items)}".replace(";", ",")
                for kind, items in self.flags.items()]

    def as_metadata(self) -> dict:
        return {"flags": self.flag_lines(),
                "reasons": [{"cell": cell, "reason": reason} for cell, reason in self.reasons]}


@dataclass(frozen=True)
class Plan:
    """What the executor does with each cell of a notebook, decided before it runs."""

    roles: tuple[str, ...]  # per cell: "test", "setup" (the lab's locked code), "learner", "other"
    labels: tuple[str, ...]  # per cell: its grade_id, else "cell N" (1-based)
    reads: dict[int, tuple[str, ...]]  # test cell -> the names it reads
    protects: dict[int, tuple[str, ...]]  # setup cell -> names it binds that a test reads
    imports: tuple[str, ...]  # modules the guard imports before the first cell
    watch: tuple[str, ...]  # modules the guard watches ("pkg.*": with its submodules)
    data: tuple[str, ...] = ()  # of those, the modules whose data values it watches too

    @classmethod
    def of(cls, nb) -> Plan:
        roles = tuple(_role(cell) for cell in nb.cells)
        labels = tuple(cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell {i + 1}"
                       for i, cell in enumerate(nb.cells))
        trees = {i: parse_cell(cell.source) for i, cell in enumerate(nb.cells)
                 if roles[i] in ("test", "setup")}
        reads = {i: tuple(sorted(_names_read(tree))) for i, tree in trees.items()
                 if roles[i] == "test"}
        read_by_tests = set().union(*reads.values())
        protects = {i: tuple(sorted(_names_bound(tree) & read_by_tests))
                    for i, tree in trees.items() if roles[i] == "setup"}
        modules = set().union(*(_modules(trees[i]) for i in reads))
        uses_gpulab = any(m == "gpulab" or m.startswith("gpulab.") for m in modules)
        # The lab's own cells' gpulab modules too: loaded before the snapshot, they are in it.
        setup = set().union(*(_modules(trees[i]) for i in trees if roles[i] == "setup"))
        modules |= {m for m in setup if uses_gpulab and (m == "gpulab" or m.startswith("gpulab."))}
        imports = sorted(modules | set(CHECKER_MODULES if uses_gpulab else ()))
        watch = sorted(modules | set(CHECKER_WATCH if uses_gpulab else ()))
        return cls(roles, labels, reads, {i: n for i, n in protects.items() if n},
                   tuple(imports), tuple(watch), CHECKER_DATA if uses_gpulab else ())


def _role(cell) -> str:
    meta = cell.metadata.get("nbgrader", {})
    if cell.cell_type != "code":
        return "other"
    if meta.get("solution"):
        return "learner"
    if meta.get("grade"):
        return "test"
    return "setup" if meta.get("locked") else "learner"


def parse_cell(source: str) -> ast.Module:
    """A cell as Python: IPython's magics (%time, !ls) turned into calls first."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def _names_read(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _names_bound(tree: ast.Module) -> set[str]:
    """Names a cell binds at its top level (not inside its functions)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _modules(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


# ----------------------------------------------------------------------------- before grading


@dataclass(frozen=True)
class Intake:
    """What was wrong with a submission's notebooks before anything ran."""

    unreadable: dict[str, str]  # notebook file name -> why nbgrader could not grade it
    record: Record  # duplicated, deleted and stray cells, missing notebooks


def admit_submission(submitted: Path, source: Path) -> Intake:
    """Check each notebook in `submitted` (the worker's private copy) against the lab's source
    notebook of the same name, and repair the copy where nbgrader 0.9 would crash on it: a
    cell's nbgrader metadata that names no cell of the lab, or a cell handed in twice (all
    copies but the last become ordinary cells, as nbgrader's DeduplicateIds would make them,
    but without the half-empty metadata its add_missing_cells then fails on)."""
    unreadable, record = {}, Record()
    for lab_notebook in sorted(Path(source).glob("*.ipynb")):
        path = Path(submitted) / lab_notebook.name
        if not path.is_file():
            record.note("missing notebook", path.name, f"{path.name} was not handed in: its "
                        "tests score zero")
            continue
        nb, why = read_notebook(path)
        if nb is None:
            unreadable[path.name] = why
            record.note("unreadable notebook", path.name, f"{path.name}: {why}")
            continue
        lab = nbformat.read(lab_notebook, as_version=4)
        known = {_grade_id(cell) for cell in lab.cells} - {None}
        last = {_grade_id(cell): i for i, cell in enumerate(nb.cells)}
        handed_in = [_grade_id(cell) for cell in nb.cells]
        repaired = False
        for i, cell in enumerate(nb.cells):
            grade_id = _grade_id(cell)
            if "nbgrader" in cell.metadata and (grade_id not in known or last[grade_id] != i):
                del cell.metadata["nbgrader"]
                repaired = True
                if grade_id not in known:
                    record.note("ignored cell metadata", f"cell {i + 1}", f"cell {i + 1} claims "
                                f"to be the lab's cell {grade_id!r}, which the lab does not have")
        if repaired:
            nbformat.write(nb, path)
        for grade_id in sorted({g for g in known if handed_in.count(g) > 1}):
            record.note("duplicated cell", grade_id, f"{grade_id} was handed in "
                        f"{handed_in.count(grade_id)} times; the last copy was graded, once, "
                        "and the others ran as ordinary cells")
        for cell in lab.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and meta.get("grade_id") not in handed_in:
                record.note("restored cell", meta["grade_id"], f"{meta['grade_id']} was "
                            "missing from the submission; the lab's copy was put back and run")
    return Intake(unreadable, record)


def read_notebook(path: Path):
    """(notebook, None), or (None, why it is not a notebook nbgrader can grade)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except UnicodeDecodeError:
        return None, "not a notebook: the file is not text"
    except json.JSONDecodeError as error:
        return None, f"not a notebook: invalid JSON ({error.msg} at line {error.lineno})"
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        return None, "not a notebook: JSON without a list of cells"
    try:
        nb = nbformat.reads(json.dumps(data), as_version=4)
        nbformat.validate(nb)
    except Exception as error:  # nbformat raises many kinds; each means the same here
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return None, f"not a valid notebook ({first[:200]})"
    return nb, None


def _grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta.get("grade_id") if isinstance(meta, dict) else None
