"""Process plumbing shared by the launchers: children that die with their parent, output that
comes back prefixed with its rank, stack dumps of hung processes, and a stop that leaves nothing.

"No orphans, ever" takes several defences, because each one alone has a hole:
- every child runs in its own session (process group), so one killpg reaches what it started;
- on Linux, PR_SET_PDEATHSIG kills a child the moment its parent dies (a crashed kernel);
- the ranks of run_on_ranks also watch a pipe from the launcher: end of file before they have
  finished means the launcher is gone (this one works on macOS too, see worker.py);
- `stop` snapshots the whole process tree (psutil) before it signals, so grandchildren that
  left their session (torchrun's workers do) are killed too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
# Asks a process to dump its Python stacks. Not SIGUSR1: that is the preemption notice SLURM's
# --signal sends by default (runtime/notice.py), and a job that handles it would replace the dump.
STACK_SIGNAL = getattr(signal, "SIGUSR2", None)
KILL_SIGNAL = getattr(signal, "SIGKILL", signal.SIGTERM)  # cannot be caught (SIGTERM on Windows)


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def loopback_interface() -> str | None:
    """The loopback network interface ("lo" on Linux, "lo0" on macOS), for GLOO_SOCKET_IFNAME."""
    with contextlib.suppress(OSError, AttributeError):
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    return None


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OutputForwarder:
    """Read children's stdout/stderr in threads; print the lines, prefixed, from the caller's
    thread (Jupyter shows output printed by the thread that runs the cell), and keep the last
    `keep_lines` lines of each stream by key (None: keep them all).

    With hold=True nothing is printed until `release()`: start-up chatter of an attempt that
    fails and is retried never reaches the notebook (its error message quotes what matters).
    `echo` may be a filter, echo(line) -> bool: only those lines are printed (all are kept).
    `on_line(key, line)`, when given, sees every line as it is drained, held or not (a
    launcher's trigger: see notice.py)."""

    def __init__(self, keep_lines: int | None = 40, echo=True, hold: bool = False,
                 on_line=None):
        self._lines: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.kept: dict[str, deque] = {}
        self._keep_lines, self._echo, self._on_line = keep_lines, echo, on_line
        self._held: list[tuple[bool, str]] | None = [] if hold else None
        self.last_printed = time.monotonic()  # when a line last reached the screen

    def release(self) -> None:
        """Print what was held back, and everything from now on as it comes."""
        held, self._held = self._held or [], None
        for to_stderr, text in held:
            self._print(to_stderr, text)

    def watch(self, pipe, prefix: str, to_stderr: bool, key: str | None = None) -> None:
        """Forward `pipe` line by line; keep its lines under `key` (default: the prefix)."""
        key = prefix if key is None else key
        self.kept.setdefault(key, deque(maxlen=self._keep_lines))
        thread = threading.Thread(target=self._read, args=(pipe, prefix, to_stderr, key),
                                  daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read(self, pipe, prefix, to_stderr, key) -> None:
        with contextlib.suppress(ValueError, OSError):
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._lines.put((prefix, to_stderr, key, line))
        with contextlib.suppress(OSError):
            pipe.close()

    def drain(self) -> None:
        """Print every line read so far."""
        while True:
            try:
                prefix, to_stderr, key, line = self._lines.get_nowait()
            except queue.Empty:
                return
            self.kept[key].append(f"{prefix}{line}")
            if self._on_line is not None:
                self._on_line(key, line)
            if self._held is not None:
                self._held.append((to_stderr, f"{prefix}{line}"))
            else:
                self._print(to_stderr, f"{prefix}{line}")

    def _print(self, to_stderr: bool, text: str) -> None:
        if self._echo is True or (callable(self._echo) and self._echo(text)):
            self.say(text, to_stderr)

    def say(self, text: str, to_stderr: bool = False) -> None:
        """Print a line of the launcher's own, from the caller's thread."""
        print(text, file=sys.stderr if to_stderr else sys.stdout, flush=True)
        self.last_printed = time.monotonic()

    def finish(self, timeout_s: float = 2.0) -> None:
        """Wait (briefly) for the readers to reach end of file, then print what is left."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.drain()

    def text(self, key: str, last: int | None = None) -> str:
        """The kept lines of `key`, the last `last` of them (all when None)."""
        lines = list(self.kept.get(key, ()))
        return "\n".join(lines[-last:] if last else lines)


def dump_stacks(pids: dict[int, int], stack_files: dict[int, Path], wait_s: float = 1.0):
    """Signal each process to write its Python stacks (faulthandler) and read what they wrote."""
    if STACK_SIGNAL is None:
        return {}
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, STACK_SIGNAL)
    # faulthandler writes from the signal handler in one go: a file is complete once it has
    # stopped growing.
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {key: _size(stack_files[key]) for key in pids}
        if all(now[key] > 0 and now[key] == sizes.get(key) for key in pids):
            break
        sizes = now
    return {key: _read_text(stack_files[key]) for key in pids}


def user_stack(text: str) -> str:
    """From a faulthandler dump of all threads, the main thread's frames above the launcher's
    entry function (the frames of the launcher itself and of runpy are left out)."""
    entries = ("runtime/worker.py", "runtime/torchrun_entry.py")
    blocks = text.strip().split("\n\n")
    def is_entry(line: str) -> bool:
        return any(e in line for e in entries) and line.rstrip().endswith(" in main")

    main = next((b for b in blocks if any(map(is_entry, b.splitlines()))), blocks[0])
    keep = []
    for line in main.splitlines()[1:]:
        if is_entry(line):
            break  # below: the entry function and the bootstrap
        if line.strip() and not any(e in line for e in (*entries, "runpy")):
            keep.append(line)
    return "\n".join(keep)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tree(pid: int) -> list:
    """The process and all its descendants, as psutil.Process objects (empty without psutil)."""
    try:
        import psutil
    except ImportError:
        return []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def stop(procs, grace_s: float = 1.0) -> None:
    """Stop the processes and everything they started: SIGTERM, then SIGKILL after `grace_s`."""
    # Snapshot the tree first: once a parent is killed its children are re-parented and lost.
    tree = [p for proc in procs if proc.poll() is None for p in _tree(proc.pid)[1:]]
    for sig in (signal.SIGTERM, getattr(signal, "SIGKILL", signal.SIGTERM)):
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    if hasattr(os, "killpg"):
                        os.killpg(proc.pid, sig)  # the child's own session: pid == pgid
                    else:
                        proc.send_signal(sig)
        for p in tree:
            with contextlib.suppress(Exception):
                p.send_signal(sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
            time.sleep(0.02)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    _reap(tree)


def _reap(tree) -> None:
    """Wait for killed descendants, so none is left as a zombie of ours."""
    for p in tree:
        with contextlib.suppress(Exception):
            p.wait(timeout=2)
