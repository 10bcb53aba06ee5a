"""What the capstone's checkers share: the learner's code and plan checked before anything runs,
the 2-node x 2-process cluster launched, a failed run explained, the tolerances.
"""

from __future__ import annotations

from gpulab.capstone import ParallelPlan, run_capstone
from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.ranks import learner_frames
from gpulab.distributed.runtime.node_script import SourceNotFound
from gpulab.env import grading
from gpulab.stubs import STUB_HINT
from gpulab.stubs import is_stub_function as is_stub

NODES, PROCS_PER_NODE = 2, 2
PREDICTION_TOLERANCE = 0.10  # |predicted / measured - 1|


def loss_tolerance() -> float:
    """How far a step's loss may be from the one-process fp32 reference: bf16 weights move the
    tiny GPT's loss by < 0.01 over its first steps (tests/test_capstone_units.py)."""
    import gpulab

    return gpulab.runner.pick(cpu=0.03, gpu=0.05)


def require_learner_code(fn, name: str) -> None:
    require_own_function(fn, name)
    if is_stub(fn):
        raise AssertionError(f"{name} would have raised NotImplementedError on every rank: it "
                             f"is still the stub. {STUB_HINT}")


def require_valid_plan(plan, config) -> None:
    if not isinstance(plan, ParallelPlan):
        raise AssertionError(f"plan is a {type(plan).__name__}: make it a "
                             "gpulab.capstone.ParallelPlan(dp_size=..., ...)")
    try:
        plan.check(NODES * PROCS_PER_NODE, PROCS_PER_NODE, config)
    except ValueError as error:
        raise AssertionError(f"PLAN: {error}") from None


def launch_on_cluster(what: str, graded: dict, plan, config, **options):
    try:
        run = run_capstone(graded["shard_model"], graded.get("save_checkpoint"),
                           graded.get("load_checkpoint"), plan=plan, config=config,
                           progress=not grading(), **options)  # the learner sees it move
    except SourceNotFound as error:
        raise AssertionError(f"{what}: {error}") from None
    if not run.ok:
        raise AssertionError(failure_text(what, run))
    return run


def failure_text(what: str, run) -> str:
    text = run.error
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no traceback"
    if "the cluster failed to start" in text:
        return (f"{what}: the cluster could not start its ranks (twice), before any of your "
                f"code ran: {last[:300]}\nThis is the machine, not your code: run it again.")
    stub = "NotImplementedError" in last
    out = [f"{what}: rank {run.failed_rank} {'raised NotImplementedError' if stub else 'failed'}"
           f" on the cluster: {last[:400]}"]
    frames = learner_frames(text)
    if frames:
        out.append(f"Where, in capstone_train.py (your code, as every rank runs it):\n{frames}")
    out.append(STUB_HINT if stub else "The lines above show where it failed; run_capstone(..., "
               "echo=True) in a cell of your own shows every rank's output.")
    return "\n".join(out)


