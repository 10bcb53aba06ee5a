"""Launching the capstone: the learner's functions, written out as a script, trained by gpulab's
loop (train.py) on every rank of a LocalCluster (2 nodes x 2 processes by default).

    run = run_capstone(shard_model, save_checkpoint, load_checkpoint, plan=plan,
                       config=config, checkpoint_dir="ckpt", kill_at_step=6, max_restarts=1)
    run.losses            # the mean loss of each step this attempt ran (float)
    run.start_step        # where the last attempt began: > 0 after a resume from a checkpoint
    run.peak_bytes        # each rank's measured peak during measure_step
    run.profile(rank=0)   # where profile_step's time went on that rank
    run.notice            # with notice=Notice(...): what the notice did (NoticeReport)

A multi-node job runs a file on every node: gpulab.distributed.runtime.node_script.script_of copies
the functions' sources (and what they use from the notebook) into it, and its end calls
gpulab.capstone.train.main on each rank. The functions are checked by name only: grading is
gpulab.checks.capstone's, against references it computes itself.
Taught in: the capstone (solutions/capstone_distributed_gpt)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpulab.capstone.config import CapstoneConfig
from gpulab.capstone.plan import ParallelPlan
from gpulab.capstone.train import PROGRESS
from gpulab.distributed.runtime.cluster import LocalCluster
from gpulab.distributed.runtime.node_script import script_of
from gpulab.stubs import is_stub_function

SCRIPT_NAME = "capstone_train.py"
PRELUDE = '''"""What every rank of the capstone runs: your functions, copied from the notebook, then
gpulab's training loop (gpulab/capstone/train.py). Written by gpulab.capstone.launch."""
import gpulab  # first: it decides the runner

import torch
import torch.distributed as dist
'''
MAIN = '''if __name__ == "__main__":
    import sys

    from gpulab.capstone.train import main

    main(globals(), sys.argv[1], {graded!r})
'''


@dataclass(frozen=True)
class CapstoneRun:
    """What a capstone run on the cluster left behind (the last torchrun attempt's ranks)."""

    ok: bool
    error: str  # the failing rank's traceback; "" when ok
    failed_rank: int | None
    ranks: tuple[dict, ...]  # each rank's record (gpulab.capstone.train), by rank
    isolation: str  # "netns" or "loopback"
    stdout: str  # every node's output
    script: str  # what every rank ran
    loss_log: tuple[tuple[int, int, float], ...] = ()  # (attempt, step, loss), every attempt
    notice: object = None  # the NoticeReport of notice=Notice(...); None when none was sent
    exit_codes: dict = dataclasses.field(default_factory=dict)  # {rank: its exit code}

    def attempt_losses(self, attempt: int) -> dict[int, float]:
        """{step: loss} of the steps that torchrun's attempt `attempt` ran (0: the first)."""
        return {step: loss for a, step, loss in self.loss_log if a == attempt}

    @property
    def losses(self) -> list[float]:
        return [float.fromhex(v) for v in self.ranks[0]["losses"]] if self.ranks else []

    @property
    def start_step(self) -> int:
        return self.ranks[0]["start_step"] if self.ranks else 0

    @property
    def restarts(self) -> int:
        return max((r["restart_count"] for r in self.ranks), default=0)

    @property
    def peak_bytes(self) -> list[int | None]:
        return [r["peak_bytes"] for r in self.ranks]

    def profile(self, rank: int = 0) -> dict | None:
        return self.ranks[rank]["profile"] if self.ranks else None

    def summary(self) -> str:
        from gpulab.memory import format_bytes

        if not self.ok:
            return f"the run failed on rank {self.failed_rank}:\n{self.error}"
        peaks = ", ".join(format_bytes(p) if p else "-" for p in self.peak_bytes)
        steps = f"steps {self.start_step}..{self.start_step + len(self.losses) - 1}"
        resumed = (f", resumed from the checkpoint of step {self.start_step} after "
                   f"{self.restarts} restart(s)" if self.start_step else "")
        return (f"{len(self.ranks)} ranks ({self.isolation}){resumed}; {steps}: loss "
                f"{self.losses[0]:.4f} -> {self.losses[-1]:.4f}; peak per rank: {peaks}")


def _is_progress(line: str) -> bool:
    """A line train.py prints for the notebook as the run goes (after the node and rank)."""
    return PROGRESS in line


def run_capstone(shard_model, save_checkpoint=None, load_checkpoint=None, *, plan: ParallelPlan,
                 config: CapstoneConfig, nodes: int = 2, procs_per_node: int = 2,
                 steps: int | None = None, checkpoint_dir=None, kill_at_step: int | None = None,
                 kill_rank: int | None = None, measure_step: int | None = 1,
                 profile_step: int | None = None, max_restarts: int = 0,
                 isolation: str = "auto", timeout_s: float = 120.0, echo: bool = False,
                 progress: bool = True, check: bool = False, install_notice_handler=None,
                 handle_notice=None, notice=None, record_dir=None) -> CapstoneRun:
    """Train config's GPT with `plan` on a nodes x procs_per_node LocalCluster: shard_model(model,
    mesh, plan) on every rank, then `steps` optimizer steps (default config.steps); with
    checkpoint_dir, load_checkpoint(folder, model, optimizer) first and
    save_checkpoint(folder, model, optimizer, step) every config.checkpoint_every steps.
    kill_at_step: a rank (kill_rank, default the last) SIGKILLs itself there on the first
    attempt; give max_restarts=1 so that torchrun restarts the group. check=True raises
    RuntimeError when the run fails. echo=True prints everything the nodes print; else
    progress=True prints rank 0's loss at each step, the kill and the resume, as they happen.
    Part 4: install_notice_handler() runs on every rank before the first step and
    handle_notice(folder, model, optimizer, steps_done) after every step; notice, a
    gpulab.distributed.Notice whose target is a node, is sent when a line of the run's output
    contains its on_output ("step 4: loss"); record_dir keeps a record of every save and the
    digest of the state a resume loaded (gpulab.capstone.preemption)."""
    plan.check(nodes * procs_per_node, procs_per_node, config)
    if kill_at_step is not None and (checkpoint_dir is None or max_restarts < 1):
        raise ValueError("kill_at_step needs checkpoint_dir (to resume from) and "
                         "max_restarts >= 1 (for torchrun to restart the group)")
    graded = {"shard_model": shard_model, "save_checkpoint": save_checkpoint,
              "load_checkpoint": load_checkpoint,
              "install_notice_handler": install_notice_handler, "handle_notice": handle_notice}
    graded = {role: fn for role, fn in graded.items() if fn is not None}
    stubs = [role for role, fn in graded.items() if is_stub_function(fn)]
    if stubs:
        raise NotImplementedError(f"{', '.join(stubs)} still raise NotImplementedError: write "
                                  "them before running the capstone.")
    script = script_of(graded, PRELUDE, MAIN.format(
        graded={role: fn.__name__ for role, fn in graded.items()}))
    spec = {"config": dataclasses.asdict(config), "plan": dataclasses.asdict(plan),
            "steps": config.steps if steps is None else steps,
            "checkpoint_dir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
            "kill_at_step": kill_at_step, "measure_step": measure_step,
            "profile_step": profile_step,
            "record_dir": str(Path(record_dir).resolve()) if record_dir else None}
    if kill_rank is not None:
        spec["kill_rank"] = kill_rank
    work = Path(tempfile.mkdtemp(prefix="gpulab-capstone-"))
    try:
        (work / SCRIPT_NAME).write_text(script)
        (work / "spec.json").write_text(json.dumps(spec))
        shown = True if echo else (_is_progress if progress else False)
        with LocalCluster(nodes, procs_per_node, isolation, echo=shown) as cluster:
            result = cluster.run(work / SCRIPT_NAME, [str(work)], timeout_s=timeout_s,
                                 max_restarts=max_restarts, notice=notice)
        ranks = []
        if result.ok:
            ranks = [json.loads((work / f"rank{r}.json").read_text())
                     for r in range(nodes * procs_per_node)]
        log = work / "loss_log.jsonl"
        entries = [json.loads(line) for line in log.read_text().splitlines()] if (
            log.exists()) else []
        loss_log = tuple((e["attempt"], e["step"], float.fromhex(e["loss"])) for e in entries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    error = result.error.replace(f"{work}/", "")
    run = CapstoneRun(result.ok, error, result.failed_rank, tuple(ranks), result.isolation,
                      result.stdout, script, loss_log, result.notice, dict(result.exit_codes))
    if check and not run.ok:
        raise RuntimeError(run.summary())
    return run
