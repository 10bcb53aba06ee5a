"""torchrun from a notebook cell: write a script, run it on N ranks, read what happened.

    result = torchrun_script('''
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    print(dist.get_rank(), t.item())
    dist.destroy_process_group()
    ''', nproc_per_node=2)
    result.returncode, result.stdout, result.failed_rank, result.error

This is the launcher people use outside notebooks, run for real: `python -m torch.distributed.run
--standalone --nproc-per-node N script.py` (standalone: a private rendezvous on a free port).
With nnodes > 1 it starts nnodes torchrun agents on this machine, joined by a c10d rendezvous,
the way a multi-node job is started on a cluster (one agent per node).

What this wrapper adds: the time limit and "no process left behind" of run_on_ranks, every
output line prefixed with its rank, and the first failing rank's traceback in `result.error`.
Taught in: lessons/04_distributed_fundamentals.ipynb (multi-node launch: lesson 06)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulab.distributed.runtime import bootstrap, processes
from gpulab.distributed.runtime.bootstrap import PACKAGE_ROOT
from gpulab.distributed.runtime.errors import LaunchTimeout, RankError
from gpulab.distributed.runtime.torchrun_entry import RAISED_STARTING
from gpulab.distributed.runtime.worker import StatusBoard, describe, read_status


@dataclass(frozen=True)
class TorchrunResult:
    """What a torchrun launch left behind."""

    returncode: int  # torchrun's exit status: 0 when every rank exited with 0
    stdout: str  # the ranks' standard output, each line prefixed "[rank N] "
    stderr: str  # the ranks' standard error and torchrun's own log, same prefixes
    failed_rank: int | None  # the rank that failed first, None when all succeeded
    error: str  # that rank's traceback (or torchrun's account of it), "" on success

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def torchrun_script(source_text: str, nproc_per_node: int, nnodes: int = 1,
                    args: Sequence[str] = (), *, timeout_s: float | None = 120.0,
                    start_timeout_s: float = 120.0, name: str = "script.py", echo: bool = True,
                    check: bool = False, env: dict[str, str] | None = None) -> TorchrunResult:
    """Write `source_text` to a temporary `name` and run it with torchrun on
    nnodes * nproc_per_node ranks. As in run_on_ranks, timeout_s counts from the moment every
    rank is past start-up (see starting_ranks: Python, imports and init_process_group have
    start_timeout_s); past it, every process is stopped and LaunchTimeout says where each rank
    was. check=True raises RankError when a rank fails."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"need nproc_per_node >= 1 and nnodes >= 1, got {nproc_per_node}, "
                         f"{nnodes}")
    work = Path(tempfile.mkdtemp(prefix="gpulab-torchrun-"))
    script = work / name
    script.write_text(textwrap.dedent(source_text))
    report = work / "report"
    report.mkdir()
    forwarder = processes.OutputForwarder(keep_lines=None, echo=echo)
    agents: list[subprocess.Popen] = []
    try:
        for node_rank, command in enumerate(_commands(nproc_per_node, nnodes, report, script,
                                                      args)):
            agents.append(subprocess.Popen(
                command, env=_env(nproc_per_node, env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
            node = f"[node {node_rank}] " if nnodes > 1 else ""
            forwarder.watch(agents[-1].stdout, node, to_stderr=False, key="stdout")
            forwarder.watch(agents[-1].stderr, node, to_stderr=True, key="stderr")
        returncode = _supervise(agents, report, nproc_per_node * nnodes, forwarder,
                                timeout_s, start_timeout_s)
        forwarder.finish()
        stdout, stderr = forwarder.text("stdout"), forwarder.text("stderr")
        failed_rank, error = _first_failure(report, stderr) if returncode else (None, "")
        result = TorchrunResult(returncode, stdout, stderr, failed_rank, error)
    finally:
        processes.stop(agents)  # the tree: agents and the workers in their own sessions
        forwarder.finish()
        shutil.rmtree(work, ignore_errors=True)
    if check and not result.ok:
        raise RankError(f"rank {result.failed_rank} failed under torchrun (exit status "
                        f"{result.returncode}):\n{result.error}", result.failed_rank or 0,
                        traceback=result.error)
    return result


def _supervise(agents, report: Path, world_size: int, forwarder, timeout_s,
               start_timeout_s) -> int:
    """Wait for the agents to exit; return the first non-zero exit status (0 if none)."""
    clock = RunClock(start_timeout_s, timeout_s)
    while any(a.poll() is None for a in agents):
        forwarder.drain()
        limit = clock.passed(starting_ranks(report, world_size))
        if limit:
            raise timeout_error(report, world_size, limit)
        failed = [a.returncode for a in agents if a.poll() not in (None, 0)]
        if failed and _all_ranks_done(report, world_size):
            # A node failed and every rank has finished: the other agents would only wait at
            # torchrun's exit barrier (for minutes) for a node that is gone. Stop them now.
            return failed[0]
        time.sleep(0.02)
    return next((a.returncode for a in agents if a.returncode != 0), 0)


def starting_ranks(report: Path, world_size: int) -> list[int]:
    """The ranks still starting: Python and the imports before their script runs, or inside
    init_process_group (_torchrun_entry marks both), or failed there. Only once this list is
    empty does the script's own time, the one timeout_s limits, begin."""
    starting = []
    for rank in range(world_size):
        phase, _, detail = read_status(report / f"rank{rank}.status")
        if phase in ("boot", "init") or detail == RAISED_STARTING:
            starting.append(rank)
    return starting


class RunClock:
    """The two time limits of a torchrun launch. start_timeout_s holds while some rank is
    starting; timeout_s counts from the moment none is. A rank that starts again (torchrun
    restarted it, or it joins a process group late) starts both counts again."""

    def __init__(self, start_timeout_s: float, timeout_s: float | None):
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self.start_deadline = time.monotonic() + start_timeout_s
        self.run_deadline: float | None = None  # set once every rank is past start-up

    def passed(self, starting: list[int]) -> str | None:
        """The limit that has passed ("timeout_s=3"), or None; `starting` from starting_ranks."""
        now = time.monotonic()
        if starting:
            if self.run_deadline is not None:  # back to start-up: a fresh start limit
                self.start_deadline, self.run_deadline = now + self.start_timeout_s, None
            if now > self.start_deadline:
                return f"start_timeout_s={self.start_timeout_s:g}"
        elif self.run_deadline is None:
            self.run_deadline = now + (self.timeout_s if self.timeout_s is not None else 1e12)
        elif now > self.run_deadline:
            return f"timeout_s={self.timeout_s:g}"
        return None


def _all_ranks_done(report: Path, world_size: int) -> bool:
    """Every rank returned from its script, raised, or died."""
    import psutil

    for rank in range(world_size):
        path, pid_file = report / f"rank{rank}.status", report / f"rank{rank}.pid"
        if not path.exists() or not pid_file.exists():
            return False
        board = StatusBoard(path)
        done = board.get()[0] == "done"
        board.close()
        if not done and psutil.pid_exists(int(pid_file.read_text() or 0)):
            return False
    return True


def _commands(nproc_per_node, nnodes, report: Path, script: Path, args) -> list[list[str]]:
    boot = bootstrap.command("agent", os.getpid())
    if nnodes == 1:
        rendezvous = [["--standalone"]]
    else:  # nnodes agents on this machine, as on a cluster: one c10d rendezvous for the job
        endpoint, job = f"127.0.0.1:{processes.free_port()}", f"gpulab-{uuid.uuid4().hex[:8]}"
        rendezvous = [["--nnodes", str(nnodes), "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", endpoint, "--rdzv-id", job,
                       "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}"]
                      for i in range(nnodes)]
    return [boot + rdzv + ["--nproc-per-node", str(nproc_per_node), "--tee", "3",
                           *bootstrap.TORCHRUN_RANK, str(report), str(script),
                           *map(str, args)]
            for rdzv in rendezvous]


def _env(nproc_per_node: int, extra: dict[str, str] | None) -> dict[str, str]:
    import gpulab

    env = dict(os.environ, GPULAB_RUNNER=gpulab.runner.name, PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank ${rank}] ",
               PYTHONPATH=os.pathsep.join([PACKAGE_ROOT,
                                           *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    loopback = processes.loopback_interface()
    if loopback:
        env.setdefault("GLOO_SOCKET_IFNAME", loopback)
    env.update(extra or {})
    return env


def _first_failure(report: Path, stderr: str) -> tuple[int | None, str]:
    """The rank whose exception came first, with its traceback; else torchrun's root cause."""
    errors = []
    for path in report.glob("rank*.error"):
        record = json.loads(path.read_text())
        errors.append((record["time"], int(path.stem.removeprefix("rank")), record["traceback"]))
    if errors:
        _, rank, text = min(errors)
        return rank, text
    # No Python exception (a crash, a signal, sys.exit(1)): torchrun's summary names the rank.
    root = stderr.rpartition("Root Cause")[2]
    found = re.search(r"rank\s*:\s*(\d+)", root)
    return (int(found.group(1)) if found else None), root.strip()


def timeout_error(report: Path, world_size: int, limit: str) -> LaunchTimeout:
    boards = {int(p.stem.removeprefix("rank")): p for p in report.glob("rank*.status")}
    pids = {int(p.stem.removeprefix("rank")): int(p.read_text() or 0)
            for p in report.glob("rank*.pid")}
    where = {}
    for rank, path in sorted(boards.items()):
        board = StatusBoard(path)
        where[rank] = describe(board)
        board.close()
    running = {r: pid for r, pid in pids.items() if pid and not where.get(r, "").startswith(
        "finished")}
    stacks = processes.dump_stacks(running, {r: report / f"rank{r}.stack" for r in running})
    stacks = {r: processes.user_stack(text) for r, text in stacks.items() if text.strip()}
    lines = [f"torchrun did not finish within {limit} s; torchrun and every rank were stopped."]
    lines += [f"  rank {r}: {w}" for r, w in sorted(where.items())]
    missing = sorted(set(range(world_size)) - set(where))
    if missing:
        lines.append(f"  ranks {missing}: not started (still in rendezvous?)")
    for r, stack in sorted(stacks.items()):
        lines += [f"--- rank {r}, Python stack when stopped (most recent call first) ---", stack]
    return LaunchTimeout("\n".join(lines), {r: w for r, w in where.items() if r in running},
                         stacks)
