"""Start gloo ranks by forking a warm interpreter: a rank's fresh interpreter spends about 2.5 s of
CPU importing torch, and a notebook launches ranks dozens of times.

    server = shared_server()                            # started on first use, then kept
    rank = server.start([launch_dir, "0"], env, go_fd)  # like subprocess.Popen: pid, poll(),
                                                        # wait(), returncode, stdout, stderr

The server is a fresh interpreter (started like any rank) that imports torch and the rank's
code once, starts no thread and runs no torch op, then forks one child per rank it is asked
for. Forking is safe there for the reason it is unsafe elsewhere: the server never ran anything
that leaves a lock held in another thread (torch's DataLoader forks its workers the same way).
A child becomes what `python -c <bootstrap> rank LAUNCH_DIR RANK` would be: its own session, the
launcher's environment, stdout and stderr on the launcher's pipes, new random seeds. Unlike
fresh interpreters, all ranks share one string-hash seed (PYTHONHASHSEED), so sets of strings
iterate in the same order on every rank.

Used for gloo launches on Linux only. An nccl rank starts in a fresh interpreter: CUDA must be
initialized in the rank itself, and a GPU rank's 2 s are small beside its work. When the
launcher's environment changes (a cell sets os.environ[...]), the server is replaced, since
what it imported read the old one, but for the momentary variables (gpulab.env.
MOMENTARY_VARIABLES), which the server does not inherit. GPULAB_FRESH_RANKS=1 turns the server
off (gpulab.env.fresh_ranks).

The loop that forks and reports, and a child's fresh start, are forking.py's, shared with a
LocalCluster node's server (nodeserver.py).

No orphans (see processes.py): the server and each child die with their parent
(PR_SET_PDEATHSIG), the server exits when the launcher's end of its socket closes, and every
child is in its own session, so `processes.stop` reaches it by its pid as it reaches a Popen's.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

import gpulab
from gpulab.distributed.runtime import bootstrap, forking
from gpulab.env import FRESH_RANKS_VARIABLE, MOMENTARY_VARIABLES, fresh_ranks

# What a rank imports (gpulab decides the runner, as in each rank). torch._dynamo too: a rank's
# first optimizer, and FSDP and DTensor calls, import it on the spot (torch._disable_dynamo),
# about 2 s of CPU in every rank if the server has not.
WARM = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.tensor", "gpulab",
        "gpulab.distributed.runtime.by_value", "gpulab.distributed.runtime.worker")
START_TIMEOUT_S = 120.0  # for the server's imports, on a loaded 2-core machine


class _Shared:
    """This process's server. A private class's attribute, not a module global: the grading
    guard (autograder/integrity.py) reads a module's plain values as the checkers' data, and a
    registry that changes as the notebook runs is not that."""

    lock = threading.Lock()
    server: ForkServer | None = None


def available(backend: str) -> bool:
    """Whether ranks of `backend` are forked from the server here."""
    return (backend == "gloo" and sys.platform.startswith("linux")
            and not fresh_ranks())


def shared_server(momentary: frozenset[str] = MOMENTARY_VARIABLES) -> ForkServer:
    """This process's server: started on first use, replaced when it died or when this
    process's environment changed since it started (`momentary` variables aside)."""
    with _Shared.lock:
        if _Shared.server is None or not _Shared.server.usable():
            if _Shared.server is not None:
                _Shared.server.close()
            _Shared.server = _start_in_keeper_thread(momentary)
        return _Shared.server


def lasting(env: Mapping[str, str], momentary: frozenset[str]) -> dict[str, str]:
    """`env` as what a server imported would have read it: all but the `momentary` variables."""
    return {k: v for k, v in env.items() if k not in momentary}


def _start_in_keeper_thread(momentary: frozenset[str]) -> ForkServer:
    """A server whose parent thread lives as long as it does. PR_SET_PDEATHSIG fires when the
    thread that started a process exits, not the process: a server started from a launch in a
    short-lived thread would be killed with that thread, its ranks with it."""
    started: queue.Queue = queue.Queue()

    def keep():
        try:
            server = ForkServer(momentary)
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            started.put(error)
            return
        started.put(server)
        server.closed.wait()

    threading.Thread(target=keep, name="gpulab-forkserver", daemon=True).start()
    server = started.get()
    if isinstance(server, BaseException):
        raise server
    return server


class ForkedRank:
    """A rank forked by the server, with the parts of subprocess.Popen the launcher uses."""

    def __init__(self, server: ForkServer, pid: int, stdout, stderr):
        self._server, self.pid, self.stdout, self.stderr = server, pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


def _gone(pid: int) -> bool:
    """No such process, another user's (the pid was reused), or a zombie: dead, and no longer
    anyone's to reap here (its parent, the server, died before it)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:  # Linux, as the server is
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class ForkServer:
    """The launcher's end: one socket to the server, and the exit codes it reports."""

    def __init__(self, momentary: frozenset[str] = MOMENTARY_VARIABLES, command=None,
                 start_timeout_s: float = START_TIMEOUT_S):
        """`command(fd, launcher_pid)`: the server's command line (default: bootstrap's
        "forkserver" role; a test starts one of its own that speaks the same protocol)."""
        command = command or (lambda fd, pid: bootstrap.command("forkserver", fd, pid))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._momentary, self._start_timeout_s = momentary, start_timeout_s
        self._environ = lasting(os.environ, momentary)
        env = dict(self._environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
                   GPULAB_RUNNER=gpulab.runner.name)  # decides as the ranks' environment does
        try:
            self._proc = subprocess.Popen(
                command(theirs.fileno(), os.getpid()),
                env=env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        finally:
            theirs.close()
        self._socket = ours
        self._exits: dict[int, int] = {}
        self._replies: dict[int, int] = {}
        self._changed = threading.Condition()
        self._next_id = 0
        self.closed = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        atexit.register(self.close)

    def usable(self) -> bool:
        return (self._proc.poll() is None
                and lasting(os.environ, self._momentary) == self._environ)

    def start(self, argv: list[str], env: dict[str, str], go_fd: int) -> ForkedRank:
        """A child running the rank `argv` (LAUNCH_DIR RANK) with `env`, reading `go_fd`."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            with self._changed:
                request_id, self._next_id = self._next_id, self._next_id + 1
            message = json.dumps({"id": request_id, "argv": argv, "env": env}).encode()
            socket.send_fds(self._socket, [message], [out_write, err_write, go_fd])
        except OSError:
            pass  # the server is gone: said below, with its exit code
        finally:
            os.close(out_write)
            os.close(err_write)
        deadline = time.monotonic() + self._start_timeout_s
        with self._changed:
            while request_id not in self._replies:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    os.close(out_read)
                    os.close(err_read)
                    raise OSError(f"the fork server did not start rank {argv[1]} (its exit "
                                  f"code: {self._proc.poll()}); set {FRESH_RANKS_VARIABLE}=1 to "
                                  "start each rank in a fresh interpreter")
                self._changed.wait(0.05)
            pid = self._replies.pop(request_id)
        return ForkedRank(self, pid, os.fdopen(out_read, "rb"), os.fdopen(err_read, "rb"))

    def exit_code(self, pid: int) -> int | None:
        """The child's exit code as Popen gives it; None while it runs. A server that died (a
        rank's code killed its parent) reports nothing more: its children die with it
        (PDEATHSIG), and one that is gone counts as killed."""
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
        if self._proc.poll() is None:
            return None
        return -signal.SIGKILL if _gone(pid) else None

    def close(self) -> None:
        """Close the socket: the server sees end of file and exits; its children are the
        launcher's to stop (they are stopped before a launch returns)."""
        self.closed.set()
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _read(self) -> None:
        while True:
            try:
                data = self._socket.recv(forking.MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                return
            event = json.loads(data)
            with self._changed:
                if "exit" in event:
                    self._exits[event["exit"]] = event["code"]
                else:
                    self._replies[event["id"]] = event["pid"]
                self._changed.notify_all()


# ----------------------------------------------------------------------------- the server


def serve(fd: int | str, launcher_pid: int | str) -> None:
    """The server: dies with the launcher, imports WARM, then forks a rank per request until the
    launcher's end closes. (Its bootstrap passes both numbers as text.)"""
    from gpulab.distributed.runtime.processes import die_with_parent

    die_with_parent(int(launcher_pid))
    sock = socket.socket(fileno=int(fd))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter's interrupt is the launcher's
    for name in WARM:  # the point of the server: imported once, for every rank
        importlib.import_module(name)
    serve_forks(sock, _become_rank)


def serve_forks(sock: socket.socket, become) -> None:
    """The protocol's server end on `sock` (forking.fork_loop): per request (JSON and 3 file
    descriptors) a child that runs become(sock, request, fds) and never returns; the answers
    {"id", "pid"}, then {"exit": pid, "code"}. Exits when the launcher's end closes."""

    def take():
        request, fds = forking.receive(sock, 3)
        if request is None:
            raise forking.Stop
        return request, fds, request["id"]

    def report(request_id, pid, code):
        forking.send_event(sock, {"id": request_id, "pid": pid} if code is None
                           else {"exit": pid, "code": code})

    forking.fork_loop(sock, take, lambda request, fds, _: become(sock, request, fds), report)
    os._exit(0)  # the launcher is gone; its ranks see their "go" pipe close and exit too


def _become_rank(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In the child: look like `python -c <bootstrap> rank LAUNCH_DIR RANK`, then run the rank."""

    def rank() -> None:
        os.setsid()  # its own session: one killpg stops it and what it starts
        sock.close()
        out_fd, err_fd, go_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((devnull, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(source, target)
            os.close(source)
        forking.take_environment(request["env"])
        sys.argv = ["-c", "rank", *request["argv"]]
        bootstrap.enter("rank", request["argv"], go_fd=go_fd, parent_pid=os.getppid())

    forking.live_as_child(rank)
