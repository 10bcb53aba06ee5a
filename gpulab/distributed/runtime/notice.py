"""A preemption notice delivered to one node of a LocalCluster or one rank of run_on_ranks, as
a spot VM, a Kubernetes pod or a SLURM job gets one: a signal, a grace period, then SIGKILL.

    notice = Notice(target=1, on_output="step 3 done", grace_s=5.0)
    result = cluster.run("train.py", notice=notice)        # node 1 is told, mid-run
    result.notice.exited_in_grace, result.notice.exit_codes, result.requeue_requested

The trigger is a line of the run's own output, not a clock: the program says when it reached
the point (a step printed), so the notice lands at the same place on a loaded machine as on an
idle one. It fires once, the first time any forwarded line contains `on_output`. Print it
after init_process_group: the signal goes to the ranks that have started by then.

Who receives the signal: the target's ranks themselves (and their process groups), as on a spot
VM, where every process gets it. A LocalCluster node's torchrun agent is not asked to pass it on:
torchrun handles only TORCHELASTIC_SIGNALS_TO_HANDLE (default SIGTERM, SIGINT, SIGHUP,
SIGQUIT), answering one by sending it to its workers and SIGKILL 30 s later, and SIGUSR1 (what
SLURM's --signal sends) simply kills it. Once the node's ranks are gone, or killed at the end of
the grace period, the node's agent is stopped too: the machine is gone.

The requeue convention: a job that caught the notice, saved and stopped cleanly exits with
REQUEUE_EXIT_CODE, 75, EX_TEMPFAIL in BSD's <sysexits.h> ("temporary failure, the user is
invited to retry"). It is told apart from every other ending: 0 is done, 1 is Python's uncaught
exception, 128 + N is what a shell reports for a process killed by signal N (143: an unhandled
SIGTERM, 137: SIGKILL), none of which says "my state is saved, start me again". Schedulers are
told the code, not taught it: SLURM requeues on it with `RequeueExit=75` in slurm.conf (or the
batch script's trap runs `scontrol requeue`), and a Kubernetes Job's podFailurePolicy matches
it with `onExitCodes: {operator: In, values: [75]}` (action Ignore: restart without counting a
failure); a pod with restartPolicy OnFailure restarts on any code but 0.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (preemption deep dive)
"""

from __future__ import annotations

import contextlib
import os
import signal as signals
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.distributed.runtime.processes import KILL_SIGNAL

REQUEUE_EXIT_CODE = 75  # "saved, stopped cleanly: start me again" (EX_TEMPFAIL; see above)


@dataclass(frozen=True)
class Notice:
    """What a platform tells a process it is about to take away: `signal`, then `grace_s`
    seconds, then SIGKILL. Sent to one node of a LocalCluster (target = node rank) or one rank of
    run_on_ranks (target = rank), when a line of that run's output contains `on_output`
    (deterministic: the program says when it reached the point, no clock)."""

    target: int
    on_output: str
    grace_s: float = 30.0
    signal: int = signals.SIGTERM

    def __post_init__(self):
        if not self.on_output:
            raise ValueError("on_output must be a non-empty piece of a line the run prints")
        if self.grace_s < 0:
            raise ValueError(f"grace_s is in seconds and at least 0, got {self.grace_s}")
        if self.target < 0:
            raise ValueError(f"target is a node rank or a rank, at least 0, got {self.target}")


@dataclass(frozen=True)
class NoticeReport:
    """What happened to the processes that were given notice.

    exit_codes: {rank: code} for each rank that received the signal; a negative code is the
    signal that ended it (-9: killed at the end of the grace period); None: it ended without
    saying how (e.g. os._exit under torchrun)."""

    where: str  # "node 1" or "rank 1": what was given notice
    signal_name: str  # "SIGTERM"
    grace_s: float
    sent_after_s: float  # from the launch to the notice
    ranks: tuple[int, ...]  # the ranks that received the signal
    exit_codes: dict[int, int | None]
    exited_in_grace: bool  # every one of them ended by itself before the grace period ran out
    took_s: float  # from the notice to the last one's end (to the kill when killed)

    @property
    def killed(self) -> bool:
        """SIGKILL ended them: the grace period ran out."""
        return not self.exited_in_grace

    @property
    def requeue_requested(self) -> bool:
        """They all stopped by themselves with REQUEUE_EXIT_CODE: saved, start me again."""
        return self.exited_in_grace and bool(self.exit_codes) and all(
            code == REQUEUE_EXIT_CODE for code in self.exit_codes.values())

    def __str__(self) -> str:
        who = ", ".join(f"rank {r}" for r in self.ranks) or "no rank"
        head = (f"{self.where} was given notice: {self.signal_name} {self.sent_after_s:.1f} s "
                f"after the launch, then {self.grace_s:g} s of grace ({who}).")
        if self.killed:
            return (f"{head} It did not exit within the grace period and was killed (SIGKILL) "
                    f"{self.took_s:.1f} s after the notice.")
        if not self.ranks:  # the trigger came before any of them had started
            return f"{head} None of its ranks was running yet: nothing received the signal."
        codes = sorted(set(self.exit_codes.values()), key=str)
        chosen = [code for code in codes if code is not None and code >= 0]
        endings = [f"with exit code {', '.join(map(str, chosen))}"] if chosen else []
        endings += [self._ending(code) for code in codes if code not in chosen]
        # A signal's default action (no handler) also ends it in time: not "by itself".
        how = "exited by itself" if chosen == codes else "ended"
        said = " (requeue requested)" if self.requeue_requested else ""
        return (f"{head} It {how} within the grace period, {self.took_s:.1f} s after the "
                f"notice, {'; '.join(endings)}{said}.")

    def _ending(self, code: int | None) -> str:
        """How a rank ended that chose no exit code: a signal, or an end outside Python."""
        if code is None:  # under torchrun only the agent sees how its worker ended
            return ("without an exit code of its own (it did not leave through Python: a "
                    "signal's default action, or os._exit)")
        name = signal_name(-code)
        return f"killed by {name}" + (": no handler caught it" if name == self.signal_name
                                      else "")


class NoticeClock:
    """One notice in one launch: whether it fired, when, and the grace period's end. The
    launcher feeds it the output lines it forwards (`saw`) and asks `due`/`expired`."""

    def __init__(self, notice: Notice):
        self.notice = notice
        self.began = time.monotonic()
        self.sent_at: float | None = None  # monotonic time of the signal
        self.ended_at: float | None = None  # when the noticed processes ended (or were killed)
        self.pids: dict[int, int] = {}  # {rank: pid} of the processes that got the signal
        self.killed = False  # SIGKILL ended them at the end of the grace period
        self._due = False

    def saw(self, _key: str, line: str) -> None:
        """An output line of the run: the first that contains on_output makes the notice due."""
        if self.sent_at is None and not self._due and self.notice.on_output in line:
            self._due = True

    def due(self) -> bool:
        """The trigger was seen and the signal is still to send (true once)."""
        if not self._due:
            return False
        self._due, self.sent_at = False, time.monotonic()
        return True

    @property
    def sent(self) -> bool:
        return self.sent_at is not None

    def expired(self) -> bool:
        """Sent, and the grace period is over."""
        return self.sent and time.monotonic() - self.sent_at > self.notice.grace_s

    def end(self, killed: bool = False) -> None:
        """The noticed processes are gone: by themselves, or `killed` now."""
        if self.ended_at is None:
            self.ended_at, self.killed = time.monotonic(), killed

    def tend(self, ranks: Callable[[], dict[int, int]], gone: Callable[[], bool]) -> None:
        """One look from a launcher's loop: when the notice is due, signal the live processes of
        `ranks()` ({rank: pid}); once sent, end it when `gone()` says they ended, or SIGKILL
        the live ones at the end of the grace period. Only live pids are signalled: an ended
        process's pid may be another's by now."""
        if self.due():
            self.pids = ranks()
            for pid in filter(running, self.pids.values()):
                send(pid, self.notice.signal)
        if not self.sent or self.ended_at is not None:
            return
        if gone():
            self.end()
        elif self.expired():
            for pid in filter(running, self.pids.values()):
                send(pid, KILL_SIGNAL)
            self.end(killed=True)

    def report(self, where: str, exit_codes: dict[int, int | None]) -> NoticeReport:
        """The report, with each noticed rank's exit code."""
        ended = self.ended_at if self.ended_at is not None else time.monotonic()
        return NoticeReport(where, signal_name(self.notice.signal), self.notice.grace_s,
                            self.sent_at - self.began, tuple(sorted(exit_codes)),
                            dict(exit_codes), not self.killed, ended - self.sent_at)


def signal_name(signum: int) -> str:
    try:
        return signals.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def send(pid: int, signum: int) -> None:
    """Send `signum` to a process and to the process group it leads (its own children, such as
    DataLoader workers, get it too, as every process of a VM does); quietly if it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
            return
        os.kill(pid, signum)


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie has exited; its parent has not
    collected it yet)."""
    try:
        import psutil
    except ImportError:  # without psutil: only whether the pid exists
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
