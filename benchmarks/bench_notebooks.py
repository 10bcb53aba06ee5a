"""Each lesson and lab solution, run top to bottom on this runner: its wall time against the time
the notebook itself states, and its longest wait with nothing new on the screen.

Every notebook says in its first cell how long it runs, in one form:
"runs top to bottom in about N minutes" (or "in under N minutes"), on a 2-core CPU. That sentence
is the budget (one source: the learner reads the number this benchmark checks), and
tests/test_notebook_times.py checks that every notebook has one. Targets, on the cpu runner:

    wall time           <= the stated time ("about N": up to 1.25 N; "under N": N)
    longest silence     <= 15 s: a cell that works longer prints progress (a line per step,
                        or a bar) so that a learner can tell working from hung

On a GPU the notebooks do more work at full sizes and are reported without targets.

A lesson also states how long a learner takes: each `## ` section's heading ends with
"· core, ~N min" or "· deep dive (optional), ~N min" (the exercises: "· ~N min"), and the first
cell sums them: "the core path takes about N minutes; everything, with the deep dives and the
exercises, about M minutes". `sections()` estimates every section from its own words, code,
outputs and exercises at the rates below (docs/notebook-times.md says where they come from), and
tests/test_notebook_times.py holds the headings to the estimate and the first cell to the sums.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from common import Row

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = (
    "lessons/01_gpu_architecture.ipynb",
    "lessons/02_cuda_with_numba.ipynb",
    "lessons/03_pytorch_on_the_gpu.ipynb",
    "lessons/04_distributed_fundamentals.ipynb",
    "lessons/05_multi_gpu_strategies.ipynb",
    "lessons/06_model_pipeline_tensor_parallelism.ipynb",
    "lessons/07_gpu_memory.ipynb",
    "lessons/08_profiling_and_optimization.ipynb",
    "solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb",
    "solutions/lab2_amp_training/lab2_amp_training.ipynb",
    "solutions/lab3_ddp_from_scratch/lab3_ddp_from_scratch.ipynb",
    "solutions/lab4_memory_and_profiling/lab4_memory_and_profiling.ipynb",
    "solutions/lab5_parallelism_across_nodes/lab5_parallelism_across_nodes.ipynb",
    "solutions/capstone_distributed_gpt/capstone_distributed_gpt.ipynb",
)
STATED = re.compile(r"runs top to bottom in (about|under) (\d+(?:\.\d+)?) minutes?")
ABOUT = 1.25  # "about N minutes" allows a quarter more
SILENCE_S = 15.0


def stated_time(path: Path) -> tuple[str, float]:
    """("about" or "under", minutes) from the notebook's first cell; ValueError without one."""
    first = "".join(json.loads(path.read_text())["cells"][0]["source"])
    found = STATED.search(" ".join(first.split()))  # the sentence may wrap
    if not found:
        raise ValueError(f"{path.name}'s first cell does not say 'runs top to bottom in about N "
                         "minutes' (or 'in under N minutes')")
    return found.group(1), float(found.group(2))


# --- reading time: how long a learner takes -------------------------------------------------------
PROSE_WORDS_PER_MIN = 175  # technical prose, read with care
CODE_LINES_PER_MIN = 10  # code read to be understood, not skimmed
RUN_CELL_MIN = 0.5  # run a code cell and look at what it shows
OUTPUT_LINES_PER_MIN = 40  # printed tables and source...
OUTPUT_LINES_READ = 40  # ...up to this many lines a cell (longer outputs are scanned)
EXERCISE_MIN = 6  # work one exercise, then compare with its answer
EXERCISE_SECTIONS = ("Exercises", "Check yourself")
SECTION = re.compile(r"^## (?P<title>.+?)(?: · (?:(?P<kind>core|deep dive \(optional\)), )?"
                     r"~(?P<minutes>\d+) min)?$")
READING = re.compile(r"core path takes about (\d+) minutes; everything, with the deep dives and "
                     r"the exercises, about (\d+) minutes")


@dataclass(frozen=True)
class Section:
    """One `## ` section of a notebook, or what comes before the first ("start")."""

    title: str
    kind: str | None  # "start", "core", "deep dive", "exercises"; None: its heading has no mark
    stated_min: int | None  # the minutes its heading states
    estimated_min: float  # from its words, code, outputs and exercises, at the rates above


def _code_minutes(cell) -> float:
    code = [line for line in cell["source"].splitlines()
            if line.strip() and not line.startswith("# NBVAL")]
    shown = 0
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        text = out.get("text", "") or ("" if "image/png" in data else data.get("text/plain", ""))
        shown += len("".join(text).splitlines())
    return (len(code) / CODE_LINES_PER_MIN + RUN_CELL_MIN
            + min(shown, OUTPUT_LINES_READ) / OUTPUT_LINES_PER_MIN)


def _exercise_minutes(text: str) -> float:
    questions = text.split("### Answers")[0]  # the answers are read as part of each exercise
    return EXERCISE_MIN * len(re.findall(r"^\d+\. ", questions, flags=re.M))


def sections(path: Path) -> list[Section]:
    """The notebook's sections in order, each with its mark and its estimated reading time."""
    import nbformat

    found = [["(start)", "start", None, []]]  # title, kind, stated minutes, markdown and cells
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "markdown":
            found[-1][3].append(cell)
            continue
        fenced = False
        for line in cell.source.splitlines():
            fenced ^= line.startswith("```")  # a `## ` inside a code block is not a heading
            heading = None if fenced else SECTION.match(line)
            if heading:
                title, kind = heading["title"], heading["kind"]
                if kind is None and heading["minutes"] and title in EXERCISE_SECTIONS:
                    kind = "exercises"
                minutes = int(heading["minutes"]) if heading["minutes"] else None
                found.append([title, kind and kind.removesuffix(" (optional)"), minutes, []])
            else:
                found[-1][3].append(line)
    result = []
    for title, kind, stated, parts in found:
        text = "\n".join(p for p in parts if isinstance(p, str))
        if title in EXERCISE_SECTIONS:
            estimate = _exercise_minutes(text)
        else:
            estimate = (len(text.split()) / PROSE_WORDS_PER_MIN
                        + sum(_code_minutes(c) for c in parts if not isinstance(c, str)))
        result.append(Section(title, kind, stated, estimate))
    return result


def reading_minutes(path: Path) -> tuple[float, float]:
    """(core path, everything) in minutes, from the sections' marks: the start as estimated, each
    marked section as its heading states."""
    parts = sections(path)
    core = sum(s.estimated_min if s.kind == "start" else s.stated_min or 0
               for s in parts if s.kind in ("start", "core"))
    rest = sum(s.stated_min or 0 for s in parts if s.kind in ("deep dive", "exercises"))
    return core, core + rest


def stated_reading(path: Path) -> tuple[int, int]:
    """(core path, everything) in minutes, as the notebook's first cell states them."""
    first = "".join(json.loads(path.read_text())["cells"][0]["source"])
    found = READING.search(" ".join(first.split()))
    if not found:
        raise ValueError(f"{path.name}'s first cell does not say 'the core path takes about N "
                         "minutes; everything, with the deep dives and the exercises, about M "
                         "minutes'")
    return int(found.group(1)), int(found.group(2))


def budget_s(path: Path) -> float:
    """The most seconds the notebook may take on the cpu runner, from what it states."""
    how, minutes = stated_time(path)
    return 60 * minutes * (ABOUT if how == "about" else 1.0)


def execute(path: Path) -> tuple[float, float, int]:
    """Run a notebook in a fresh kernel from its own folder: (wall seconds, the longest wait
    with no new output inside one cell, that cell's index)."""
    import nbformat
    from nbclient import NotebookClient

    class Watched(NotebookClient):
        """Notes when each cell starts, shows anything new (an output, or a widget's update,
        such as a tqdm bar moving), and ends."""

        moments: dict[int, list[float]] = {}

        def process_message(self, msg, cell, cell_index):
            if msg["msg_type"] not in ("status", "execute_input"):
                self.moments.setdefault(cell_index, []).append(time.perf_counter())
            return super().process_message(msg, cell, cell_index)

    def started(cell, cell_index):
        Watched.moments[cell_index] = [time.perf_counter()]

    def ended(cell, cell_index, execute_reply):
        Watched.moments[cell_index].append(time.perf_counter())

    nb = nbformat.read(path, as_version=4)
    client = Watched(nb, timeout=900, kernel_name="python3", on_cell_start=started,
                     on_cell_executed=ended, resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - start
    silences = {index: max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=0.0)
                for index, ts in Watched.moments.items()}
    cell = max(silences, key=silences.get)
    return wall, silences[cell], cell


def run(quick: bool) -> list[Row]:
    import gpulab

    on_cpu = gpulab.runner.name == "cpu"
    rows = []
    for rel in NOTEBOOKS:
        path = ROOT / rel
        budget = budget_s(path)
        if quick:
            rows.append(Row("notebooks", f"{path.stem} wall time", float("nan"), "s",
                            note="not run with --quick"))
            continue
        seconds, silence, cell = execute(path)
        how, minutes = stated_time(path)
        rows.append(Row("notebooks", f"{path.stem} wall time", seconds, "s",
                        target=f"<= {budget:.0f} s" if on_cpu else "",
                        ok=(seconds <= budget) if on_cpu else None,
                        note=f"{gpulab.runner.name} runner; it states {how} {minutes:g} min"))
        rows.append(Row("notebooks", f"{path.stem} longest silence", silence, "s",
                        target=f"<= {SILENCE_S:.0f} s" if on_cpu else "",
                        ok=(silence <= SILENCE_S) if on_cpu else None,
                        note=f"in cell {cell} (counted from 0)"))
    return rows
