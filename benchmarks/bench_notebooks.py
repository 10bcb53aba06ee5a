"""Wall time of each lesson and lab solution, run top to bottom on this runner, against the
budget the course promises (a learner should not wait longer than this on a CPU).

Budgets are for the cpu runner; on a GPU the same notebooks do more work at full sizes and are
reported without a target.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import Row

ROOT = Path(__file__).resolve().parents[1]

# notebook (relative to the repository) -> budget in seconds on the cpu runner
BUDGETS_S = {
    "lessons/01_gpu_architecture.ipynb": 120,
    "lessons/02_cuda_with_numba.ipynb": 180,
    "lessons/03_pytorch_on_the_gpu.ipynb": 180,
    "lessons/04_distributed_fundamentals.ipynb": 240,
    "lessons/05_multi_gpu_strategies.ipynb": 240,
    "lessons/06_model_pipeline_tensor_parallelism.ipynb": 300,
    "lessons/07_gpu_memory.ipynb": 240,
    "lessons/08_profiling_and_optimization.ipynb": 240,
    "solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb": 180,
    "solutions/lab2_amp_training/lab2_amp_training.ipynb": 180,
    "solutions/lab3_ddp_from_scratch/lab3_ddp_from_scratch.ipynb": 240,
    "solutions/lab4_memory_and_profiling/lab4_memory_and_profiling.ipynb": 240,
    "solutions/lab5_parallelism_across_nodes/lab5_parallelism_across_nodes.ipynb": 300,
    # Five launches of a 2-node x 2-process cluster, two of them with a killed worker.
    "solutions/capstone_distributed_gpt/capstone_distributed_gpt.ipynb": 480,
}


def execute(path: Path) -> float:
    """Run a notebook in a fresh kernel from its own folder; return the wall time in seconds."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def run(quick: bool) -> list[Row]:
    import gpulab

    on_cpu = gpulab.runner.name == "cpu"
    rows = []
    for rel, budget in BUDGETS_S.items():
        path = ROOT / rel
        if not path.exists():
            continue
        if quick:
            rows.append(Row("notebooks", f"{path.stem} wall time", float("nan"), "s",
                            note="not run with --quick"))
            continue
        seconds = execute(path)
        rows.append(Row("notebooks", f"{path.stem} wall time", seconds, "s",
                        target=f"<= {budget} s" if on_cpu else "",
                        ok=(seconds <= budget) if on_cpu else None,
                        note=f"{gpulab.runner.name} runner"))
    return rows
