"""`release LAB`: the student version labs/LAB from solutions/LAB, by nbgrader generate_assignment.

nbgrader replaces `### BEGIN SOLUTION` regions with a stub, drops `### BEGIN HIDDEN TESTS`
regions, clears outputs and locks the test cells. An answer cell whose source carries
`metadata["gpulab"]["starting_code"]` is released with that code instead of the stub: a
debugging lab (Lab 2) hands out code with planted bugs to fix, which no stub can carry. It runs
in a throwaway nbgrader course root,
so a release never touches the gradebook. The result is a pure function of the lab's source:
the same source gives the same bytes, which is what lets `release --check` (and a test) say
whether the committed labs/ drifted from solutions/.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autograder.course import IGNORED_NAMES, Course, run_converter

STARTING_CODE = "starting_code"  # metadata["gpulab"][...] of an answer cell, see give_starting_code
MAX_DIFF_LINES = 40  # per notebook in a drift summary: enough to see what changed


def generate_assignment(grading_root: Path, lab: str) -> Path:
    """Run nbgrader generate_assignment on grading_root/source/LAB; return release/LAB.

    It also records the lab's cells (with the hidden tests) in grading_root's gradebook, which
    autograding needs to restore locked and test cells a learner edited or deleted.
    """
    from nbgrader.converters import GenerateAssignment

    run_converter(GenerateAssignment, grading_root, lab, "*", **{"GenerateAssignment.force": True})
    return grading_root / "release" / lab


def copy_sources(course: Course, lab: str, dest: Path) -> list[Path]:
    """Copy the lab's source notebooks (notebooks only, see Course.lab_notebooks) into `dest`."""
    notebooks = course.lab_notebooks(lab)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return [Path(shutil.copyfile(nb, dest / nb.name)) for nb in notebooks]


def build_release(course: Course, lab: str, dest: Path) -> list[Path]:
    """Write the released notebooks of `lab` into the empty or missing folder `dest`."""
    with tempfile.TemporaryDirectory(prefix=f"release-{lab}-") as tmp:
        root = Path(tmp)
        copy_sources(course, lab, root / "source" / lab)
        released = generate_assignment(root, lab)
        for nb in released.glob("*.ipynb"):
            give_starting_code(root / "source" / lab / nb.name, nb)
        dest.mkdir(parents=True, exist_ok=True)
        # Bytes only: nbgrader marks its outputs read-only, the repository copy stays editable.
        return [
            Path(shutil.copyfile(nb, dest / nb.name)) for nb in sorted(released.glob("*.ipynb"))
        ]


def give_starting_code(source: Path, released: Path) -> None:
    """Put each answer cell's starting code (its source's metadata gpulab.starting_code, a string
    or a list of lines) in place of the stub nbgrader wrote into `released`."""
    import nbformat
    from nbgrader.utils import compute_checksum

    def grade_id(cell):
        return cell.metadata.get("nbgrader", {}).get("grade_id")

    given = {grade_id(cell): "".join(cell.metadata["gpulab"][STARTING_CODE])
             for cell in nbformat.read(source, as_version=4).cells
             if STARTING_CODE in cell.metadata.get("gpulab", {})}
    if not given:
        return
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("gpulab", None)  # the release carries the code once, as its source
        if grade_id(cell) in given:
            cell.source = given[grade_id(cell)]
            cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
    nbformat.write(nb, released)


def release(course: Course, lab: str) -> list[Path]:
    """Regenerate labs/LAB; anything in it that the release did not produce is removed."""
    target = course.labs / lab
    with tempfile.TemporaryDirectory(prefix=f"release-{lab}-") as tmp:
        fresh = Path(tmp) / lab
        written = build_release(course, lab, fresh)
        target.mkdir(parents=True, exist_ok=True)
        for stale in sorted(set(_listing(target)) - set(_listing(fresh))):
            (target / stale).unlink()
            print(f"removed {target / stale}: not part of the release")
        return [Path(shutil.copyfile(nb, target / nb.name)) for nb in written]


@dataclass(frozen=True)
class Drift:
    """How the committed labs/LAB differs from a fresh release of solutions/LAB."""

    lab: str
    missing: tuple[str, ...] = ()  # released, but not in labs/LAB
    extra: tuple[str, ...] = ()  # in labs/LAB, but not released
    changed: dict[str, list[str]] = field(default_factory=dict)  # name -> unified diff lines

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.changed)

    def summary(self) -> str:
        if self.ok:
            return f"labs/{self.lab} matches a fresh release of solutions/{self.lab}"
        lines = [f"labs/{self.lab} drifted from solutions/{self.lab}:"]
        lines += [f"  missing  {name}" for name in self.missing]
        lines += [f"  extra    {name}" for name in self.extra]
        for name, diff in self.changed.items():
            lines.append(f"  changed  {name}")
            shown = diff[:MAX_DIFF_LINES]
            lines += ["    " + line.rstrip("\n") for line in shown]
            if len(diff) > len(shown):
                lines.append(f"    ... {len(diff) - len(shown)} more diff lines")
        lines.append(
            f"labs/ is generated: edit solutions/{self.lab} only, then run "
            f"`python -m autograder release {self.lab}` and commit both."
        )
        return "\n".join(lines)


def check_release(course: Course, lab: str) -> Drift:
    """Release into a temporary folder and compare it, byte for byte, with labs/LAB."""
    target = course.labs / lab
    with tempfile.TemporaryDirectory(prefix=f"release-check-{lab}-") as tmp:
        fresh = Path(tmp) / lab
        build_release(course, lab, fresh)
        want, have = set(_listing(fresh)), set(_listing(target)) if target.is_dir() else set()
        changed = {}
        for name in sorted(want & have):
            new, old = (fresh / name).read_bytes(), (target / name).read_bytes()
            if new != old:
                changed[name] = list(
                    difflib.unified_diff(
                        old.decode("utf-8", "replace").splitlines(keepends=True),
                        new.decode("utf-8", "replace").splitlines(keepends=True),
                        fromfile=f"labs/{lab}/{name} (committed)",
                        tofile=f"labs/{lab}/{name} (fresh release)",
                        n=2,
                    )
                )
        return Drift(
            lab=lab,
            missing=tuple(sorted(want - have)),
            extra=tuple(sorted(have - want)),
            changed=changed,
        )


def _listing(folder: Path) -> list[str]:
    """Files under `folder` as relative paths, minus editor leftovers (.ipynb_checkpoints)."""
    names = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if path.is_file() and not IGNORED_NAMES.intersection(relative.parts):
            names.append(str(relative))
    return sorted(names)
