"""The fork servers' core: the loop that forks a child per request and reports on it, and what
a forked child does to look like a fresh interpreter. Two thin front ends use it:
forkserver.py (run_on_ranks' server: one socket pair, requests by id) and nodeserver.py (a
LocalCluster node's server: one connection per node client).

    fork_loop(wait_on, take, become, report)   # the server's life, until take() says stop
    live_as_child(life)                        # in a child: run life(), exit with its code
    take_environment(env)                      # in a child: signals, environment, seeds

Why forking a server is safe: it imported its modules and ran nothing else (no thread, no torch
op), so no lock is held in another thread when it forks (forkserver.py says more).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable

MAX_MESSAGE = 1 << 20  # a request: the environment and the arguments, as JSON


class Stop(Exception):
    """Raised by a front end's take(): the launcher is gone, the loop ends."""


def fork_loop(wait_on: socket.socket, take: Callable, become: Callable,
              report: Callable) -> None:
    """Wait on `wait_on`; when it is ready, take() returns (request, fds, reply_to), or None
    when there is nothing to fork, or raises Stop. Fork a child that runs become(request, fds,
    reply_to) and never returns; close the fds here; report(reply_to, pid, None) once forked
    and report(reply_to, pid, code) when the child ended (code as Popen gives it)."""
    children: dict[int, object] = {}
    while True:
        ready, _, _ = select.select([wait_on], [], [], 0.05)
        if ready:
            try:
                taken = take()
            except Stop:
                return
            if taken is not None:
                request, fds, reply_to = taken
                pid = os.fork()
                if pid == 0:
                    become(request, fds, reply_to)  # never returns
                for fd in fds:
                    os.close(fd)
                children[pid] = reply_to
                report(reply_to, pid, None)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            report(children.pop(pid), pid, os.waitstatus_to_exitcode(status))


def receive(sock: socket.socket, fd_count: int):
    """(request, fds) from `sock`; (None, []) at end of file or on an error, and then no fd is
    left open. A request with fewer fds than `fd_count` is no request."""
    try:
        message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, fd_count)
    except OSError:
        message, fds = b"", []
    if not message or len(fds) != fd_count:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(message), fds


def send_event(sock: socket.socket, event: dict) -> None:
    """Send `event` as JSON; a launcher or client that is gone is not an error here (the loop
    sees it at its next read, or the child dies by its pipe)."""
    try:
        sock.send(json.dumps(event).encode())
    except OSError:
        pass


def live_as_child(life) -> None:
    """In a forked child: run `life()`, then exit with its code (SystemExit's, 0, or 1 and the
    traceback); a child never returns into its server's loop."""
    code = 1
    try:
        life()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported, then the child exits with 1
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - exiting anyway
                pass
        os._exit(code)


def take_environment(env: dict[str, str]) -> None:
    """In a forked child: the signal handlers, environment and state (fresh_state) of a fresh
    interpreter started with `env`."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                      else signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    fresh_state()


def fresh_state() -> None:
    """What a fresh interpreter would have differently: its own random seeds, and the thread
    count torch would have read from OMP_NUM_THREADS at import."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
