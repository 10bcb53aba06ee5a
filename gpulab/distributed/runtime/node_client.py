"""What a LocalCluster node starts in place of its torchrun agent and of each of its ranks when
the node has a warm server (nodeserver.py): a process that imports only the standard library,
has the server fork the real one, and stands in for it until it exits.

    node_client.py SERVER_SOCKET --agent TORCHRUN_ARGS...     the launcher, for the agent
    torchrun ... --no-python PYTHON node_client.py SERVER_SOCKET REPORT_DIR script.py ARGS...

To whoever started it, it looks like the process it stands for: the signals sent to it
(SIGTERM, then SIGKILL to its session) reach that process, forwarded or through a pipe that
closes when this one dies, and it exits as that process did, with its code or by its signal.
It dies with its own parent (PR_SET_PDEATHSIG), so a killed agent takes its ranks' clients, and
so their ranks, with it. If no server answers, it becomes the process itself, started as
bootstrap.py starts it without a server.
"""

import importlib.util
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
CONNECT_WAIT_S = 10.0  # the server binds its socket first, then imports: it is there at once
MAX_MESSAGE = 1 << 20
AGENT = "--agent"
ROLES = {"agent": "agent", "rank": "torchrun-rank"}  # bootstrap.py's role for each kind


def _sibling(name: str):
    """A module of this folder (standard library only), loaded from its file: imported by name,
    it would first run gpulab's own __init__ (numpy, the runner's detection), most of the
    start-up this process exists to avoid."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"gpulab_node_client_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _run_here(kind: str, args) -> None:
    """No server: this process becomes the agent or the rank, as it would have been without
    one (PR_SET_PDEATHSIG lasts through exec)."""
    launcher = [str(os.getppid())] if kind == "agent" else []  # the agent dies with it
    os.execv(sys.executable, _sibling("bootstrap").command(ROLES[kind], *launcher, *args))


def _exit_as(code: int) -> None:
    if code < 0:  # killed by a signal: die of the same one, so the agent sees what happened
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # theirs cannot be set, or caught
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    os._exit(code if 0 <= code < 256 else 1)


def main(server_path: str, *args: str) -> None:
    _sibling("processes").die_with_parent(os.getppid())
    kind = "agent" if args[:1] == (AGENT,) else "rank"
    args = args[1:] if kind == "agent" else args
    try:
        sock = _connect(server_path)
    except OSError:
        _run_here(kind, args)
    alive_read, alive_write = os.pipe()  # the forked process kills itself when this one is gone
    request = {"kind": kind, "argv": list(args), "env": dict(os.environ), "cwd": os.getcwd()}
    try:
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2, alive_read])
        reply = sock.recv(MAX_MESSAGE)
    except OSError:
        reply = b""
    os.close(alive_read)
    if not reply:  # the server went away before forking: nothing was started
        sock.close()
        os.close(alive_write)
        _run_here(kind, args)
    pid = json.loads(reply)["pid"]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        message = sock.recv(MAX_MESSAGE)
    except OSError:
        message = b""
    # No word from the server: it died, and its children with it (PR_SET_PDEATHSIG).
    _exit_as(json.loads(message)["code"] if message else -signal.SIGKILL)


if __name__ == "__main__":
    main(*sys.argv[1:])
