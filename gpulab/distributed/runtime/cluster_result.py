"""What a run on a LocalCluster left behind, and how a failure is told apart: which rank failed
first, and whether the failure happened while the cluster was still starting (then the run is
tried again: see cluster.py).

    result.ok, result.returncode      every node's torchrun agent exited with 0 / the first failure
    result.nodes[i].stdout            node i's ranks' output, lines "[rank N] ..."
    result.failed_rank, result.error  the rank that failed first and its traceback
    result.exit_codes                 {rank: the code it exited with}
    result.notice                     what a preemption notice did (notice.py), None: none sent
    result.requeue_requested          a rank exited with REQUEUE_EXIT_CODE: saved, start me again
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.distributed.runtime.notice import REQUEUE_EXIT_CODE, NoticeReport
from gpulab.distributed.runtime.worker import StatusBoard


@dataclass(frozen=True)
class NodeResult:
    """What one node (one torchrun agent) left behind."""

    node_rank: int  # the order LocalCluster started the nodes in
    address: str  # its address: "10.213.0.1" (netns) or "127.0.0.1" (loopback)
    returncode: int  # its agent's exit status; negative: stopped by that signal
    stdout: str  # its ranks' output, each line prefixed "[rank N] "
    stderr: str  # its ranks' errors and torchrun's own log


@dataclass(frozen=True)
class ClusterResult:
    """What a run on the cluster left behind."""

    returncode: int  # 0 when every node's agent exited with 0, else the first failure's status
    nodes: tuple[NodeResult, ...]
    failed_rank: int | None  # the rank that failed first (in the last attempt), None on success
    error: str  # that rank's traceback, or torchrun's account of it; "" on success
    attempts: int  # launches made: 2 when a start-up failure was retried
    isolation: str  # "netns" or "loopback"
    # {rank: code} for each rank that left through Python (last attempt); killed ranks: none
    exit_codes: dict[int, int] = field(default_factory=dict)
    notice: NoticeReport | None = None  # what the notice did; None when none was sent

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def requeue_requested(self) -> bool:
        """Some rank stopped with REQUEUE_EXIT_CODE: the job says "saved, start me again"."""
        return REQUEUE_EXIT_CODE in self.exit_codes.values()

    @property
    def stdout(self) -> str:
        """Every node's output, each line prefixed "[node i] [rank N] "."""
        return "\n".join(f"[node {n.node_rank}] {line}" for n in self.nodes
                         for line in n.stdout.splitlines())


START_FAILURE = "the cluster failed to start"  # prefix of a ClusterResult.error that is retried


def node_ranks(report: Path, node_rank: int) -> dict[int, int]:
    """{rank: pid} of the ranks running on LocalCluster's node `node_rank` (the rendezvous,
    not LocalCluster, numbers the ranks: each rank wrote down its node when it started)."""
    ranks = {}
    for path in report.glob("rank*.node"):
        rank = int(path.stem.removeprefix("rank"))
        pid_file = report / f"rank{rank}.pid"
        if path.read_text().strip() == str(node_rank) and pid_file.exists():
            ranks[rank] = int(pid_file.read_text())
    return ranks


def exit_codes(report: Path) -> dict[int, int]:
    """{rank: the code it exited with}, for the ranks that left through Python."""
    codes = {}
    for path in report.glob("rank*.exit"):
        text = path.read_text().strip()
        if text:
            codes[int(path.stem.removeprefix("rank"))] = int(text)
    return codes


def diagnose(report: Path, stderr: str, started: bool) -> tuple[int | None, str]:
    """(the rank that failed first, its error). The error starts with START_FAILURE when the
    failure came before the script could do anything: a node gave up before every rank had
    started (e.g. the rendezvous port was taken), the exception was raised inside
    init_process_group (e.g. a refused gloo connection), or gloo aborted a rank before any
    collective."""
    rank, error = first_failure(report, stderr)
    if not started or "init_process_group" in error or aborted_at_start(report, error):
        error = f"{START_FAILURE}: {error}"
    return rank, error


def first_failure(report: Path, stderr: str) -> tuple[int | None, str]:
    """The rank whose exception came first in the last attempt, with its traceback; else the
    rank torchrun's summary names. Errors from before a restart are left out: every rank of
    the last attempt rewrote its pid file when it started."""
    pid_times = [p.stat().st_mtime for p in report.glob("rank*.pid")]
    attempt_began = min(pid_times) if len(pid_times) else 0.0
    errors = []
    for path in report.glob("rank*.error"):
        record = json.loads(path.read_text())
        if record["time"] >= attempt_began:
            errors.append((record["time"], int(path.stem.removeprefix("rank")),
                           record["traceback"]))
    if errors:
        _, rank, text = min(errors)
        return rank, text
    root = stderr.rpartition("Root Cause")[2]
    found = re.search(r"rank\s*:\s*(\d+)", root)
    return (int(found.group(1)) if found else None), (root.strip() or stderr[-2000:])


def aborted_at_start(report: Path, error: str) -> bool:
    """A rank died by SIGABRT (gloo's C++ aborts) before any rank reached a collective."""
    if "SIGABRT" not in error:
        return False
    for path in report.glob("rank*.status"):
        board = StatusBoard(path)
        phase, _, detail = board.get()
        board.close()
        if phase == "wait" or "last call" in detail:
            return False
    return True
