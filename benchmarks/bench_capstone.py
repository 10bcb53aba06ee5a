"""The capstone's plan, measured (solutions/capstone_distributed_gpt): what FSDP2 saves per rank,
how close the plan's memory prediction comes, and where a step's time goes.

    FSDP2 peak per rank, dp=4 / one process    the tiny GPT trained by 4 ranks of a 2x2
                                               LocalCluster against 1 process, the same global
                                               batch and accumulation: <= 0.5x
    predicted / measured peak                  the solution's predict_memory (the same code as
                                               tests/capstone_code.py) for both plans: within 10%
    communication share of a step (dp=4)       profile_step's breakdown on rank 0 (reported)

Peaks come from torch's FSDPMemTracker on the CPU, the allocator's max_memory_allocated on CUDA.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common import Row

NAME = "capstone"
TOLERANCE = 0.10
TESTS = Path(__file__).resolve().parents[1] / "tests"


def run(quick: bool = False) -> list[Row]:
    import gpulab  # noqa: F401 - first: it decides the runner
    from gpulab.capstone import ParallelPlan, capstone_config, run_capstone

    sys.path.insert(0, str(TESTS))
    from capstone_code import shard_model

    config = capstone_config("tiny", steps=3)
    sharded = ParallelPlan(dp_size=4, grad_accum_steps=2)
    whole = ParallelPlan(dp_size=1, grad_accum_steps=2)
    # A smoke test (--quick) runs the one-process plan only: the cluster's start is most of the
    # cost, and tests/test_capstone_cluster.py runs the 2x2 cluster and checks more of it.
    plans = {"dp=1": whole} if quick else {"dp=4": sharded, "dp=1": whole}
    how = {"dp=4": {"profile_step": 2}, "dp=1": {"nodes": 1, "procs_per_node": 1}}
    runs = {name: run_capstone(shard_model, plan=plan, config=config, measure_step=1, check=True,
                               **how[name])
            for name, plan in plans.items()}
    peak = {name: max(r.peak_bytes) for name, r in runs.items()}
    if "dp=4" not in runs:
        return [Row(NAME, "FSDP2 peak per rank, dp=4 / one process", float("nan"), "x",
                    note="not run with --quick")] + _prediction_rows(config, plans, peak)
    ratio = peak["dp=4"] / peak["dp=1"]
    rows = [Row(NAME, "FSDP2 peak per rank, dp=4 / one process", ratio, "x", target="<= 0.5x",
                ok=ratio <= 0.5, note=f"{config.name} GPT, {config.batch_size} sequences a "
                f"step in 2 microbatches; {peak['dp=4']} vs {peak['dp=1']} bytes")]
    rows += _prediction_rows(config, plans, peak)
    profile = runs["dp=4"].profile(0)
    rows.append(Row(NAME, "communication share of a step (dp=4)",
                    100 * profile["communication_s"] / profile["step_s"], "%",
                    note=f"step {profile['step_s'] * 1e3:.0f} ms; compute "
                    f"{profile['compute_s'] / profile['step_s']:.0%}, idle "
                    f"{profile['idle_s'] / profile['step_s']:.0%} (gloo on a CPU)"))
    return rows


def _prediction_rows(config, plans: dict, peak: dict) -> list[Row]:
    from capstone_code import predict_memory

    rows = []
    for name, plan in plans.items():
        off = predict_memory(config, plan) / peak[name] - 1
        rows.append(Row(NAME, f"predicted / measured peak ({name})", 1 + off, "x",
                        target=f"within {TOLERANCE:.0%}", ok=abs(off) <= TOLERANCE,
                        note="predict_memory from gpulab.memory's pieces"))
    return rows
