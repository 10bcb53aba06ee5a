"""Capstone, Part 4: a preemption notice handled, and the requeued job resumed (check_preemption).

The job runs on the 2 x 2 LocalCluster for many more steps than it will get: when rank 0 prints
a step's loss, node 1 gets SIGTERM, then GRACE_S seconds, then SIGKILL (gpulab.distributed.Notice,
as a spot VM or a pod is told). The learner's handler must let the loop stop at the next step
boundary, every rank saving the steps done through their own save_checkpoint, and exit with
REQUEUE_EXIT_CODE. Then the checker starts the job again, as a scheduler's requeue would: it must
resume at the step after the last one done, with the state saved at the notice, bit for bit
(digests of every rank's shards, gpulab/capstone/preemption.py), and train on as one process does.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gpulab.capstone import capstone_config, reference_losses, run_capstone
from gpulab.capstone.preemption import read_saves
from gpulab.checks.capstone.common import (
    NODES,
    PROCS_PER_NODE,
    failure_text,
    launch_on_cluster,
    loss_tolerance,
    require_learner_code,
    require_valid_plan,
)
from gpulab.distributed.runtime.node_script import SourceNotFound
from gpulab.distributed.runtime.notice import REQUEUE_EXIT_CODE, Notice
from gpulab.env import grading

# A GCE spot VM's and a Kubernetes pod's default. The tiny model's checkpoint takes about 1 s
# here, but 4.5 s and more when a grading runner's cores are shared (two `make test` runs side
# by side): 10 s cost the solution its points there.
GRACE_S = 30.0
GRACE_S_GPU = 60.0  # the gpu runner's 406 M-parameter GPT writes about 6.5 GB of state
CHECKPOINT_EVERY = 4  # the periodic checkpoints the notice falls between
LONG_RUN = 1000  # steps the first run asks for: far more than the grace period allows


def check_preemption(shard_model, save_checkpoint, load_checkpoint, install_notice_handler,
                     handle_notice, plan, *, notice_after_step: int = 4, node: int = 1,
                     grace_s: float | None = None, seed: int = 0,
                     isolation: str = "auto") -> None:
    """Give `node` notice once step `notice_after_step` is done (see the module), then requeue
    the job and check its resume. grace_s: the runner's (GRACE_S on the cpu runner)."""
    if grace_s is None:
        import gpulab

        grace_s = gpulab.runner.pick(cpu=GRACE_S, gpu=GRACE_S_GPU)
    for fn, name in ((shard_model, "shard_model"), (save_checkpoint, "save_checkpoint"),
                     (load_checkpoint, "load_checkpoint"),
                     (install_notice_handler, "install_notice_handler"),
                     (handle_notice, "handle_notice")):
        require_learner_code(fn, name)
    config = capstone_config(None, seed=seed, checkpoint_every=CHECKPOINT_EVERY)
    require_valid_plan(plan, config)
    graded = {"shard_model": shard_model, "save_checkpoint": save_checkpoint,
              "load_checkpoint": load_checkpoint}
    hooks = {"install_notice_handler": install_notice_handler, "handle_notice": handle_notice}
    work = Path(tempfile.mkdtemp(prefix="gpulab-capstone-notice-"))
    folder, records = work / "checkpoints", work / "saves"
    records.mkdir(parents=True)
    try:
        notice = Notice(target=node, on_output=f"step {notice_after_step}: loss", grace_s=grace_s)
        try:
            first = run_capstone(**graded, **hooks, plan=plan, config=config, steps=LONG_RUN,
                                 checkpoint_dir=folder, notice=notice, record_dir=records,
                                 measure_step=None, isolation=isolation,
                                 progress=not grading())
        except SourceNotFound as error:
            raise AssertionError(f"check_preemption: {error}") from None
        saves = read_saves(records)
        done = judge_notice(first, saves, node, grace_s)
        print(f"{first.notice}\nThe first run completed steps 0 to {done - 1}; requeued:")
        for path in records.glob("*"):
            path.unlink()
        second = launch_on_cluster("check_preemption, the requeued run", graded, plan, config,
                                   **hooks, steps=done + 2, checkpoint_dir=folder,
                                   record_dir=records, measure_step=None, isolation=isolation)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    judge_resume(second, saves, done, reference_losses(config, done + 2))


def judge_notice(run, saves: list[dict], node: int, grace_s: float) -> int:
    """The first run, given notice: how many steps it completed, or what went wrong."""
    steps_run = run.attempt_losses(0)
    done = max(steps_run) + 1 if steps_run else 0
    report = run.notice
    if report is None:
        raise AssertionError(failure_text("check_preemption", run) if not run.ok else
                             "the run ended before the notice could be sent.")
    for save in saves:
        if save["in_handler"]:
            raise AssertionError(
                f"save_checkpoint was called inside the SIGTERM handler (rank {save['rank']}, "
                f"checkpoint of step {save['step']}), and refused. Python runs a handler "
                "between two bytecodes of whatever the main thread is doing, here the step's "
                "collectives; a checkpoint's collectives started there interleave with the one "
                "in flight. Let the handler only note the notice, and save at the next step "
                "boundary, in handle_notice.")
    newest = newest_complete(saves)
    if report.killed:
        raise AssertionError(_killed_text(report, saves, node, grace_s, done, newest))
    if not report.requeue_requested:
        raised = 1 in report.exit_codes.values()  # an exception: its traceback says where
        said = f"\n{failure_text('check_preemption', run)}" if raised and not run.ok else ""
        raise AssertionError(
            f"{report} Once the checkpoint is saved, exit with REQUEUE_EXIT_CODE "
            f"({REQUEUE_EXIT_CODE}), the code a scheduler is told means 'saved: start me again' "
            "(0 says the job is done, 1 that it failed, and a SIGTERM no handler catches ends "
            f"the rank at once).{said}")
    if newest < done:
        raise AssertionError(steps_lost(done, newest))
    return done


def _killed_text(report, saves, node: int, grace_s: float, done: int, newest: int) -> str:
    cut = [s for s in saves if s["ended"] is None]
    if not cut:
        return (f"node {node} went on training after the notice: {report.took_s:.1f} s after "
                f"{report.signal_name} it was still running and was killed (SIGKILL), the grace "
                f"period being {grace_s:g} s. {steps_lost(done, newest)}")
    step, began = cut[0]["step"], sorted({s["rank"] for s in cut})
    took = [s["ended"] - s["began"] for s in saves if s["ended"] is not None]
    longest = f"; your completed saves took up to {max(took):.1f} s" if took else ""
    return (f"node {node} was killed mid-save: SIGKILL came {report.took_s:.1f} s after the "
            f"notice (the grace period is {grace_s:g} s) while the checkpoint of step {step} was "
            f"still being written (begun on rank{'s' if len(began) > 1 else ''} "
            f"{', '.join(map(str, began))}), so it is incomplete. The save must end within the "
            f"grace period{longest}: write what the resume needs, at the first step boundary "
            "after the notice.")


def newest_complete(saves: list[dict]) -> int:
    """The newest step whose checkpoint every rank finished writing (0: none)."""
    ranks = NODES * PROCS_PER_NODE
    finished: dict[int, set] = {}
    for save in saves:
        if save["ended"] is not None:
            finished.setdefault(save["step"], set()).add(save["rank"])
    return max((step for step, who in finished.items() if len(who) == ranks), default=0)


def steps_lost(done: int, newest: int) -> str:
    return (f"{done - newest} step{'s' if done - newest != 1 else ''} lost: the first run had "
            f"completed steps 0 to {done - 1}, and the newest complete checkpoint is step "
            f"{newest}'s, the periodic one. When the notice comes, checkpoint the steps done, "
            "through save_checkpoint on every rank, before exiting.")


def judge_resume(run, saves: list[dict], done: int, reference: list[float]) -> None:
    """The requeued run: where it started, the state it loaded, the losses after."""
    if run.start_step != done:
        lost = done - run.start_step
        raise AssertionError(
            f"the requeued run resumed at step {run.start_step}, but the first one had "
            f"completed {done} steps and saved them at the notice"
            + (f": {lost} step{'s' if lost != 1 else ''} lost. load_checkpoint must load the "
               "newest complete checkpoint, the one the notice left." if lost > 0 else "."))
    saved = {s["rank"]: s["digest"] for s in saves if s["step"] == done}
    for record in run.ranks:
        loaded, want = record["resumed_digest"], saved.get(record["rank"])
        for part, what in (("model", "weights"), ("optimizer", "AdamW state (moments, step)")):
            if want is not None and loaded[part] != want[part]:
                raise AssertionError(
                    f"rank {record['rank']}: the {what} the requeued run loaded differ from "
                    f"those it held at the notice (step {done}): the resume is not exact. Save "
                    "and load the optimizer's state with the model's.")
    tolerance = loss_tolerance()
    for step, loss in zip(range(done, done + 2), run.losses, strict=False):
        if abs(loss - reference[step]) > tolerance:
            raise AssertionError(f"step {step} after the requeue: loss {loss:.4f}, the "
                                 f"one-process reference {reference[step]:.4f}.")
    print(f"resumed at step {done} with the state saved at the notice, bit for bit; then "
          f"losses {[round(v, 4) for v in run.losses]}")
