"""What torchrun starts for each rank of a LocalCluster node when the node has a warm server
(_nodeserver.py): a process that imports only the standard library, has the server fork the
rank, and stands in for it until it exits.

    torchrun ... --no-python PYTHON _rank_client.py SERVER_SOCKET REPORT_DIR script.py ARGS...

To torchrun's agent it looks like the rank: the signals the agent sends it (SIGTERM, then
SIGKILL to its session) reach the rank, forwarded or through a pipe that closes when this
process dies, and it exits as the rank did, with its code or by its signal. The rank itself
(its pid file, status line and stack dumps, see _torchrun_entry.py) is the forked child. If no
server answers, it becomes the rank itself: `python -m gpulab.distributed._torchrun_entry`.
"""

import sys

del sys.path[0]  # run by path: its folder must not shadow the standard library (_pickle.py)

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
CONNECT_WAIT_S = 10.0  # the server binds its socket first, then imports: it is there at once
MAX_MESSAGE = 1 << 20


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


def _run_here(entry_args) -> None:
    """No server: this process becomes the rank, as it would have been without one."""
    os.execv(sys.executable, [sys.executable, "-m", "gpulab.distributed._torchrun_entry",
                              *entry_args])


def _exit_as(code: int) -> None:
    if code < 0:  # killed by a signal: die of the same one, so the agent sees what happened
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    os._exit(code if 0 <= code < 256 else 1)


def main(server_path: str, *entry_args: str) -> None:
    try:
        sock = _connect(server_path)
    except OSError:
        _run_here(entry_args)
    alive_read, alive_write = os.pipe()  # the rank kills itself when this process is gone
    request = {"argv": list(entry_args), "env": dict(os.environ), "cwd": os.getcwd()}
    try:
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2, alive_read])
        reply = sock.recv(MAX_MESSAGE)
    except OSError:
        reply = b""
    os.close(alive_read)
    if not reply:  # the server went away before forking: nothing was started
        sock.close()
        os.close(alive_write)
        _run_here(entry_args)
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
