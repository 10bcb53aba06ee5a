"""Hints on request: `gpulab.hint("lab1", "transpose")` prints the next hint for that part.

A lab's spec states the goal, the interface and the bound its checker holds; how to get there
is the learner's design. When stuck, a learner asks for a hint, one level per call:

    gpulab.hint("lab1", "transpose")            # level 1, then 2, then 3 on later calls
    gpulab.hint("lab1", "transpose", level=2)   # reprint one level
    gpulab.hint("lab1")                         # which parts have hints

Level 1 is the idea, level 2 the layout or the plan, level 3 the arithmetic or the code's shape.
The text lives beside the checkers, in each lab's `hints.py` (HINTS: part -> three levels).
Which levels a learner has seen is kept in a small file (gpulab.env.state_dir()), not in the
kernel, so it survives a restart and no gpulab module holds a value that changes. Hints never
change a grade: the grader does not read that file.
"""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

from gpulab.checks import PACKAGES, find_lab
from gpulab.env import state_dir

LEVELS = 3
TECHNIQUE_SUFFIX = "_technique"  # "transpose_technique" is graded on the part "transpose"
SEEN_FILE = "hints-seen.json"


def hints_of(lab) -> dict[str, tuple[str, ...]]:
    """`lab`'s hints: part name -> its levels, from gpulab/checks/<lab>/hints.py."""
    name = f"gpulab.checks.{PACKAGES[find_lab(lab)]}.hints"
    try:
        return importlib.import_module(name).HINTS
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise ValueError(f"{find_lab(lab)} is an assessment: it gives no hints. The lessons "
                         "it draws on do.") from None


def find_hints(lab, part: str) -> tuple[str, tuple[str, ...]]:
    """(the part's name in HINTS, its levels) for a part's name or its test cell's grade_id."""
    hints = hints_of(lab)
    name = part.removeprefix("test_")
    for key in (name, name.removesuffix(TECHNIQUE_SUFFIX)):
        if key in hints:
            return key, hints[key]
    raise ValueError(f"{find_lab(lab)} has no hints for {part!r}: ask for one of "
                     f"{', '.join(hints)}.")


def hint(lab, part: str | None = None, level: int | None = None, *,
         seen_file: Path | None = None) -> None:
    """Print the next hint for `part` of `lab` (or hint `level`, 1 to 3); without a part, list
    the parts that have hints."""
    if part is None:
        print(f"Hints for {find_lab(lab)}: {', '.join(hints_of(lab))}.\n"
              f"Ask with gpulab.hint({lab!r}, PART); each call shows the next level.")
        return
    key, levels = find_hints(lab, part)
    path = seen_file or state_dir() / SEEN_FILE
    record = f"{find_lab(lab)}/{key}"
    seen = _read(path)
    if level is None:
        level = min(seen.get(record, 0) + 1, len(levels))
    if not 1 <= level <= len(levels):
        raise ValueError(f"level must be 1 to {len(levels)}, not {level}.")
    if level > seen.get(record, 0):
        _write(path, {**seen, record: level})
    print(format_hint(find_lab(lab), key, level, levels))


def format_hint(lab: str, part: str, level: int, levels: tuple[str, ...]) -> str:
    body = textwrap.dedent(levels[level - 1]).strip()
    more = (f"Call again for hint {level + 1}." if level < len(levels)
            else "That is the last hint: the checker's messages say what is still wrong.")
    return f"{lab}, {part}: hint {level} of {len(levels)}\n\n{body}\n\n{more}"


def _read(path: Path) -> dict[str, int]:
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in seen.items() if isinstance(v, int)} if isinstance(seen, dict) else {}


def _write(path: Path, seen: dict[str, int]) -> None:
    try:  # a read-only home (the grading sandbox) still gets its hint, one level at a time
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(seen, indent=1, sort_keys=True))
    except OSError:
        pass
