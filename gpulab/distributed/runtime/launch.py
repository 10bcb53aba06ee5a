"""Run a function on N real processes, one per rank, with one call from a notebook cell.

    def hello(rank, world_size):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)                      # 1 + 2 + ... + world_size on every rank
        return t.item()

    run_on_ranks(hello, 4)                      # [10.0, 10.0, 10.0, 10.0], in rank order

What it does for you, and why:
- a fresh interpreter per rank, never a fork of the caller (forking a process that already has
  torch's or Numba's threads can deadlock the child); on CPU (gloo, Linux) the ranks are forked
  from a server that imported torch once and ran nothing else, which saves each rank about 2.5 s
  of CPU (forkserver.py says why that fork is safe);
- the function may be defined in the notebook itself: it travels by value (see by_value.py);
- each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as
  torchrun sets them, joins the default process group with the runner's backend (gloo on CPU,
  nccl with one GPU per rank on a GPU runner) and leaves it at the end;
- the rendezvous store is hosted by this process on a port the OS picks, so two launches (two
  notebooks, two test workers) never fight over a port;
- output comes back prefixed with "[rank N] "; return values come back in rank order;
- an exception on a rank comes back as RankError with that rank's traceback, and the other
  ranks are stopped; a hang is cut by the time limit with LaunchTimeout, which says where each
  rank was waiting; a start-up failure of the process group is retried once;
- notice=Notice(target=rank, on_output=...) gives one rank a preemption notice mid-run (its
  signal, then SIGKILL after the grace period, see notice.py); a noticed rank that does not
  return ends the launch with Preempted, which says what the notice did;
- no process outlives the call, whatever happens (see processes.py).

Taught in: lessons/04_distributed_fundamentals.ipynb
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpulab.distributed.runtime import bootstrap, by_value, forkserver, processes
from gpulab.distributed.runtime.errors import (
    LaunchTimeout,
    Preempted,
    ProcessGroupStartError,
    RankError,
)
from gpulab.distributed.runtime.notice import NoticeClock
from gpulab.distributed.runtime.worker import PHASES, StatusBoard, describe

_RUN = PHASES.index("run")
_log = logging.getLogger(__name__)
_ERROR_GRACE_S = 0.3  # after a first error, how long other ranks get to report their own


@dataclass(frozen=True)
class Launcher:
    """How to run a function on ranks. `run_on_ranks` is `Launcher(world_size, ...).run(...)`."""

    world_size: int  # number of ranks (processes)
    backend: str | None = None  # "gloo" or "nccl"; None: gpulab.runner.backend
    timeout_s: float | None = 120.0  # limit for the function, counted once every rank runs it
    start_timeout_s: float = 90.0  # limit for start-up: interpreter, imports, process group
    start_retries: int = 1  # relaunches after a start-up failure, when no user code ran
    kill_grace_s: float = 1.0  # between SIGTERM and SIGKILL when ranks are stopped
    before_init: Any = None  # called as before_init(rank, world_size) before the group forms
    echo: bool = True  # print the ranks' output here, prefixed with "[rank N] "
    notice: Any = None  # a Notice for one rank (notice.py), None: no rank is given notice

    def run(self, fn, *args, **kwargs) -> list:
        """fn(rank, world_size, *args, **kwargs) on every rank; the return values in rank order."""
        backend = self._backend()
        if self.notice is not None and not 0 <= self.notice.target < self.world_size:
            raise ValueError(f"notice.target must be a rank, 0..{self.world_size - 1}, got "
                             f"{self.notice.target}")
        payload = by_value.dumps((fn, args, kwargs, self.before_init))
        for attempt in range(self.start_retries + 1):
            try:
                return self._attempt(payload, backend)
            except ProcessGroupStartError as error:
                if error.user_code_ran or attempt == self.start_retries:
                    raise
                # Logged, not printed: a launch that then succeeds shows what it always shows.
                _log.info("%s -- retrying the launch once.", error)
        raise AssertionError("unreachable")

    def _backend(self) -> str:
        import gpulab

        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        backend = self.backend or gpulab.runner.backend
        if backend == "nccl" and self.world_size > gpulab.runner.gpu_count:
            raise ValueError(
                f"nccl needs one GPU per rank: world_size={self.world_size}, but this machine "
                f"has {gpulab.runner.gpu_count} GPU(s). Use fewer ranks, or backend='gloo'.")
        return backend

    def _attempt(self, payload: bytes, backend: str) -> list:
        import torch.distributed as dist

        pg_timeout_s = (self.timeout_s or 1800.0) + self.start_timeout_s
        # Port 0: the OS picks a free port, and this process keeps it for the whole launch.
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=pg_timeout_s),
                              wait_for_workers=False)
        launch_dir = Path(tempfile.mkdtemp(prefix="gpulab-ranks-"))
        go_read, go_write = os.pipe()  # not inherited, except by the ranks (pass_fds)
        procs: list[subprocess.Popen] = []
        boards: list[StatusBoard] = []
        clock = NoticeClock(self.notice) if self.notice is not None else None
        forwarder = processes.OutputForwarder(echo=self.echo, hold=True,  # until all run
                                              on_line=clock.saw if clock else None)
        try:
            boards += [StatusBoard(launch_dir / f"rank{r}.status", create=True)
                       for r in range(self.world_size)]
            (launch_dir / "payload.pkl").write_bytes(payload)
            (launch_dir / "spec.json").write_text(json.dumps({
                "world_size": self.world_size, "backend": backend, "store_host": "127.0.0.1",
                "store_port": store.port, "pg_timeout_s": pg_timeout_s,
                "parent_pid": os.getpid(), "go_fd": go_read, "sys_path": sys.path}))
            server = forkserver.shared_server() if forkserver.available(backend) else None
            for rank in range(self.world_size):
                env = self._env(rank, backend, store.port)
                if server is not None:
                    procs.append(server.start([str(launch_dir), str(rank)], env, go_read))
                else:
                    procs.append(subprocess.Popen(
                        bootstrap.command("rank", launch_dir, rank), env=env,
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        pass_fds=(go_read,),
                        start_new_session=True))  # its own process group: one killpg stops it
                forwarder.watch(procs[-1].stdout, f"[rank {rank}] ", to_stderr=False)
                forwarder.watch(procs[-1].stderr, f"[rank {rank}] ", to_stderr=True)
            os.close(go_read)
            go_read = None
            try:
                values = self._supervise(procs, boards, launch_dir, forwarder, clock)
            except ProcessGroupStartError:
                raise  # may be retried: its output stays held (the message quotes it)
            except BaseException:
                forwarder.release()  # the user's function ran: show all it printed
                raise
            forwarder.release()
            os.close(go_write)  # "go": every rank has its result; they leave the group and exit
            go_write = None
            self._wait_exit(procs)
            return values
        finally:
            for fd in (go_read, go_write):
                if fd is not None:
                    os.close(fd)
            processes.stop([p for p in procs if p.poll() is None], self.kill_grace_s)
            forwarder.finish()
            for board in boards:
                board.close()
            shutil.rmtree(launch_dir, ignore_errors=True)
            del store

    def _env(self, rank: int, backend: str, port: int) -> dict[str, str]:
        import gpulab

        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(self.world_size), LOCAL_WORLD_SIZE=str(self.world_size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GPULAB_RUNNER=gpulab.runner.name,  # every rank decides as this process did
                   PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        if backend == "gloo":
            # N ranks that each start one thread per core would fight over the cores.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                      // self.world_size)))
            loopback = processes.loopback_interface()  # one machine: talk over loopback
            if loopback:
                env.setdefault("GLOO_SOCKET_IFNAME", loopback)
        return env

    def _supervise(self, procs, boards, launch_dir: Path, forwarder, clock=None) -> list:
        """Wait for every rank's result, a failure, or a time limit; return values in order."""
        results: dict[int, tuple] = {}
        start_deadline = time.monotonic() + self.start_timeout_s
        run_deadline = first_error = None
        while True:
            forwarder.drain()
            for rank in range(len(procs)):
                path = launch_dir / f"rank{rank}.result"
                if rank not in results and path.exists():
                    results[rank] = by_value.loads(path.read_bytes())
            dead = {r: p.returncode for r, p in enumerate(procs)
                    if r not in results and p.poll() is not None}
            failed = dead or any(res[0] == "error" for res in results.values())
            now = time.monotonic()
            if clock is not None:
                self._deliver(clock, procs, results, dead)
            if failed and clock is not None and clock.sent:
                # After a notice the run ends with the noticed rank: the others get the same
                # grace period after it ended, to finish what they were doing (a checkpoint).
                over = clock.ended_at is not None and now - clock.ended_at > self.notice.grace_s
                if over or len(results) + len(dead) == len(procs):
                    raise self._preempted(clock, procs, results, dead, boards)
            elif failed:
                first_error = first_error or now
                if now - first_error >= _ERROR_GRACE_S or len(results) + len(dead) == len(procs):
                    raise self._failure(results, dead, boards, forwarder)
            elif len(results) == len(procs):
                return [results[r][1] for r in range(len(procs))]
            if run_deadline is None and all(_phase(b) >= _RUN for b in boards):
                forwarder.release()  # the group formed: this attempt's output is the user's
                run_deadline = now + (self.timeout_s if self.timeout_s is not None else 1e12)
            if run_deadline is not None and now > run_deadline:
                raise self._timeout(procs, boards, launch_dir)
            if run_deadline is None and now > start_deadline:
                ran = any(_phase(b) >= _RUN for b in boards)
                raise ProcessGroupStartError(
                    f"the process group failed to start within {self.start_timeout_s:g} s: "
                    + "; ".join(f"rank {r}: {describe(b)}" for r, b in enumerate(boards)
                                if _phase(b) < _RUN), None, ran)
            time.sleep(0.01)

    def _failure(self, results, dead, boards, forwarder) -> Exception:
        """The error to raise: the first rank that failed, with what the others were doing."""
        errors = sorted((res[6], r, res) for r, res in results.items() if res[0] == "error")
        others = [f"rank {r} was stopped while {describe(b)}" for r, b in enumerate(boards)
                  if r not in results and r not in dead]
        others += [f"rank {r} also raised {res[2]}: {res[3]}" for _, r, res in errors[1:]]
        tail = f"\nThe other ranks: {'; '.join(others)}." if others else ""
        ran = any(res[0] == "ok" or res[1] in ("run", "return") for res in results.values()) \
            or any(_phase(b) >= _RUN for r, b in enumerate(boards) if r not in results)
        if errors:
            _, rank, (_, phase, exc_type, message, text, exc, _) = errors[0]
            if phase == "start":
                return ProcessGroupStartError(
                    f"the process group failed to start: rank {rank} raised {exc_type}: "
                    f"{message}\n{text}{tail}", rank, ran)
            what = {"load": "could not load the function:", "run": "raised",
                    "return": "could not send back its return value:"}[phase]
            return RankError(f"rank {rank} {what} {exc_type}: {message}\n"
                             f"--- traceback from rank {rank} ---\n{text.rstrip()}{tail}",
                             rank, exc_type, text, exc)
        rank, code = min(dead.items())
        how = _exit_text(code)
        forwarder.drain()
        output = forwarder.text(f"[rank {rank}] ", last=15)
        if _phase(boards[rank]) < _RUN:
            return ProcessGroupStartError(
                f"the process group failed to start: rank {rank} {how} while "
                f"{describe(boards[rank])}.\nIts last output:\n{output}{tail}", rank, ran)
        return RankError(f"rank {rank} {how} before returning.\nIts last output:\n{output}{tail}",
                         rank, "", output)

    def _deliver(self, clock: NoticeClock, procs, results, dead) -> None:
        """Send the notice when it is due; SIGKILL the rank when its grace period is over."""
        target = self.notice.target
        clock.tend(lambda: {target: procs[target].pid},
                   lambda: target in results or target in dead)

    def _preempted(self, clock: NoticeClock, procs, results, dead, boards) -> Preempted:
        """The launch ended after a notice: what the notice did first, then each other rank."""
        codes = {r: _exit_code(res) for r, res in results.items() if res[0] == "error"}
        codes.update({r: procs[r].poll() for r in dead})
        values = {r: res[1] for r, res in results.items() if res[0] == "ok"}
        target = self.notice.target
        report = clock.report(f"rank {target}",
                              {target: codes.get(target, 0 if target in values else None)})
        others = []
        for r in range(len(procs)):
            if r == target:
                continue
            if r in values:
                others.append(f"rank {r} returned")
            elif r in results and results[r][2] == "SystemExit":
                others.append(f"rank {r} exited with code {codes[r]}")
            elif r in results:
                others.append(f"rank {r} raised {results[r][2]}: {results[r][3]}")
            elif r in dead:
                others.append(f"rank {r} {_exit_text(dead[r])}")
            else:
                others.append(f"rank {r} was stopped while {describe(boards[r])}")
        tail = f"\nAfter the notice: {'; '.join(others)}." if others else ""
        return Preempted(f"{report}{tail}", report, codes, values)

    def _timeout(self, procs, boards, launch_dir: Path) -> LaunchTimeout:
        running = {r: p.pid for r, p in enumerate(procs)
                   if p.poll() is None and _phase(boards[r]) < PHASES.index("done")}
        where = {r: describe(boards[r]) for r in running}
        stacks = processes.dump_stacks(running, {r: launch_dir / f"rank{r}.stack" for r in running})
        stacks = {r: processes.user_stack(text) for r, text in stacks.items() if text.strip()}
        done = [r for r in range(len(procs)) if r not in running]
        lines = [f"the function did not finish on every rank within timeout_s={self.timeout_s:g}"
                 " s; every rank was stopped.", "Still running:"]
        lines += [f"  rank {r}: {where[r]}" for r in sorted(where)]
        if done:
            lines.append(f"Finished: {', '.join(f'rank {r}' for r in done)}.")
        if any("waiting in" in w for w in where.values()):
            lines.append("A rank waiting in a collective forever usually means another rank "
                         "never made the matching call (a collective under `if rank == ...`, "
                         "or called a different number of times on different ranks).")
        for r, stack in sorted(stacks.items()):
            lines.append(f"--- rank {r}, Python stack when stopped (most recent call first) ---")
            lines.append(stack)
        return LaunchTimeout("\n".join(lines), where, stacks)

    def _wait_exit(self, procs) -> None:
        """Ranks leave the process group and exit; one stuck in teardown is stopped (the
        results are already here)."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.01)


def run_on_ranks(fn, world_size: int, *args, timeout_s: float | None = 120.0,
                 backend: str | None = None, notice=None, **kwargs) -> list:
    """Run fn(rank, world_size, *args, **kwargs) on `world_size` processes; return the values in
    rank order. timeout_s limits the function (start-up is not counted); None: no limit.

    fn may be defined in the notebook (it travels by value, with the notebook globals it uses);
    anything else it needs is imported on each rank with this process's sys.path and working
    folder. Arguments and return values must be picklable: return numbers or CPU tensors
    (`t.cpu()`), since a CUDA tensor would be rebuilt on this process's GPU. POSIX only (Linux,
    macOS, Colab). notice: a Notice for one rank (see notice.py); a noticed rank that exits
    instead of returning (sys.exit(REQUEUE_EXIT_CODE) after saving) ends the launch with
    Preempted."""
    return Launcher(world_size, backend=backend, timeout_s=timeout_s,
                    notice=notice).run(fn, *args, **kwargs)


def _phase(board: StatusBoard) -> int:
    return PHASES.index(board.get()[0]) if board.get()[0] in PHASES else 0


def _exit_code(result: tuple) -> int:
    """The code a rank's error result stands for: sys.exit(code)'s, else 1 (an exception)."""
    if result[2] != "SystemExit":
        return 1
    code = getattr(result[5], "code", None) if result[5] is not None else result[3] or None
    if code is None:
        return 0
    try:
        return int(code)
    except (TypeError, ValueError):
        return 1  # sys.exit("message") exits with 1


def _exit_text(code: int) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
