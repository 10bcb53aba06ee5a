"""Lab 1's solution kernels at full size: measured on this GPU against the cost model's modeled
time, a line per kernel (`make gpu-check` quotes it in docs/gpu-report.md).

    python benchmarks/lab1_measured.py

It runs the solution notebook's set-up and answer cells, then its performance report cell
("Your kernels on a GPU"), here, as a kernel would: on the gpu runner that cell traces each
kernel small on gpulab.sim, models it at full size on this GPU, then times the same kernels with
CUDA events and prints "measured, modeled (modeled / measured)" per kernel. On the cpu runner it
prints the modeled table alone, and says that nothing was measured.
"""

from __future__ import annotations

import linecache
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "solutions" / "lab1_cuda_kernels" / "lab1_cuda_kernels.ipynb"
REPORT_CELL = "report"  # the performance report's cell id
# Ungraded cells the answers or the report use (imports of worked examples); the Colab set-up
# and the learner's launch plan (Part 6) are not needed.
CONTEXT = ("cell-31", "transpose-naive")
SKIP = ("colab_setup", "waves")


def cells_to_run(nb) -> list:
    """The set-up and answer cells in notebook order, then the report cell."""
    chosen = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        name = meta.get("grade_id") or cell.get("id")
        wanted = (meta and not meta.get("grade")) or name in CONTEXT
        if cell.cell_type == "code" and wanted and name not in SKIP:
            chosen.append(cell)
    (report,) = [c for c in nb.cells if c.get("id") == REPORT_CELL]
    return [*chosen, report]


def main() -> int:
    import nbformat

    import gpulab  # decides the runner before the cells import numba.cuda

    namespace = {"__name__": "__main__"}
    for cell in cells_to_run(nbformat.read(NOTEBOOK, as_version=4)):
        filename = f"<lab1 {cell.get('id')}>"  # in linecache, as IPython keeps a cell's text
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True),
                                     filename)
        exec(compile(cell.source, filename, "exec"), namespace)
    if gpulab.runner.simulator:
        print("cpu runner: modeled times only, nothing measured (run this on a GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
