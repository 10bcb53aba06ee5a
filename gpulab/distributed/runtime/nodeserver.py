"""A warm server per LocalCluster node, which forks that node's torchrun agent and its ranks: a
fresh rank spends about 5 s of CPU importing torch and torch.distributed's FSDP, tensor and
checkpoint packages, a fresh agent about 3 s importing torch, and a 2 x 2 capstone run starts
four ranks and two agents (over half of the run's CPU).

    server = NodeServer(path, prefix, env)   # `prefix`: the node's `ip netns exec NS`, or []
    server.agent_command(prefix, args)        # what the launcher runs for the agent
    server.client_command()                   # what torchrun runs per rank
    server.close()

The server is started as the node's agent would be (same environment, same network namespace,
since a forked process keeps its parent's), binds a Unix socket at `path`, imports WARM once,
and forks a process for each node_client.py that connects, as forkserver.py does for
run_on_ranks: it runs no torch op and starts no thread, so forking it is safe. The child takes
the client's environment, working directory and standard streams, then runs what `python -m
torch.distributed.run ARGS` (the agent) or `python -m gpulab.distributed.runtime.torchrun_entry
REPORT script.py ARGS` (a rank) would.

No orphans: the server dies with the launcher (PR_SET_PDEATHSIG) and is stopped when the
cluster is left; each child dies with the server, and kills itself when its client's pipe
closes (the launcher or the agent stopped the client); a client dies with its parent.
Used on Linux, on the cpu runner: a GPU rank's imports are small beside its work, and CUDA is
best initialized in a fresh process. GPULAB_FRESH_RANKS=1 turns it off, as for run_on_ranks, and
it does not inherit the momentary variables (gpulab.env.MOMENTARY_VARIABLES).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from gpulab.distributed.runtime import bootstrap, forking, forkserver, processes
from gpulab.distributed.runtime.forkserver import lasting
from gpulab.env import MOMENTARY_VARIABLES, fresh_ranks

CLIENT = str(Path(__file__).with_name("node_client.py"))
# What any rank imports, what the course's cluster scripts add (FSDP2 and checkpointing), and
# torchrun's agent.
WARM = (*forkserver.WARM, "gpulab.distributed.runtime.torchrun_entry", "torch.distributed.fsdp",
        "torch.distributed.checkpoint", "torch.distributed.run")


def available(runner: str) -> bool:
    """Whether a cluster's ranks are forked from node servers here."""
    return (runner == "cpu" and sys.platform.startswith("linux")
            and not fresh_ranks())


class NodeServer:
    """The launcher's end: the server process of one node, and how torchrun reaches it."""

    def __init__(self, path: Path, prefix: list[str], env: dict[str, str],
                 momentary: frozenset[str] = MOMENTARY_VARIABLES):
        self.path, self.momentary = str(path), momentary
        self.env = lasting(env, momentary)  # what the server imports under, and keeps
        self._proc = subprocess.Popen(
            [*prefix, *bootstrap.command("nodeserver", self.path, os.getpid())],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)

    def usable(self, env: dict[str, str]) -> bool:
        """Alive, and started with `env` (but for the momentary variables): what it imported
        read its environment."""
        return self._proc.poll() is None and lasting(env, self.momentary) == self.env

    def agent_command(self, prefix: list[str], args: list[str]) -> list[str]:
        """The node's torchrun agent with torchrun's `args`, forked by this server."""
        return [*prefix, sys.executable, CLIENT, self.path, "--agent", *args]

    def client_command(self) -> list[str]:
        """torchrun's entry point for each rank, in place of `-m _torchrun_entry`."""
        return ["--no-python", sys.executable, CLIENT, self.path]

    def close(self) -> None:
        processes.stop([self._proc])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# ----------------------------------------------------------------------------- the server


def serve(path: str, launcher_pid: int | str) -> None:
    """Bind `path`, import WARM, then fork an agent or a rank per client until the launcher
    stops it."""
    processes.die_with_parent(int(launcher_pid))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the launcher's to handle
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)  # first: clients that connect while it imports wait in the backlog
    listener.listen(64)
    for name in WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)

    def take():  # one node client per connection; it sends its request at once
        conn, _ = listener.accept()
        conn.settimeout(5.0)
        request, fds = forking.receive(conn, 4)
        if request is None:
            conn.close()
            return None
        return request, fds, conn

    def report(conn, pid, code):  # {"pid"} once forked, {"code"} when it ended
        forking.send_event(conn, {"pid": pid} if code is None else {"code": code})
        if code is not None:
            conn.close()

    forking.fork_loop(listener, take, lambda request, fds, conn: _become(
        listener, conn, request, fds), report)


def _become(listener, conn, request: dict, fds: list[int]) -> None:
    """In the child: what bootstrap.py's "agent" or "torchrun-rank" role would be, with the
    client's streams, working folder and environment."""

    def life() -> None:
        server = os.getppid()
        os.setsid()
        listener.close()
        conn.close()
        processes.die_with_parent(server)
        *streams, alive = fds
        for source, target in zip(streams, (0, 1, 2), strict=True):
            os.dup2(source, target)
            os.close(source)
        threading.Thread(target=_die_when_closed, args=(alive,), daemon=True).start()
        os.chdir(request["cwd"])
        forking.take_environment(request["env"])
        if request.get("kind") == "agent":
            bootstrap.enter("agent", [str(server), *request["argv"]])
        else:
            bootstrap.enter("torchrun-rank", request["argv"])

    forking.live_as_child(life)


def _die_when_closed(fd: int) -> None:
    """The client holds the other end: when it is gone (stopped or killed), so is its process."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    os.kill(os.getpid(), signal.SIGKILL)
