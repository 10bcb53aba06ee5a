"""The fork server's protocol and its fallbacks, driven with standard-library children: no torch,
no ranks, a second or two (gpulab/distributed/runtime/forkserver.py, node_client.py).

The launcher's end (ForkServer) is started against a server of the test's own: one that never
answers, one that exits at once, and the real server loop (serve_forks) with children that exit,
die by a signal, or outlive a killed server. The node client is run against a node server of the
test's own, and its no-server fallback is caught where it would exec.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpulab.distributed.runtime import bootstrap, node_client
from gpulab.distributed.runtime.forkserver import ForkServer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the fork servers run on Linux only")

ROOT = Path(__file__).resolve().parents[1]
SILENT = ("import socket, sys\ns = socket.socket(fileno=int(sys.argv[1]))\n"
          "while s.recv(1 << 20):\n    pass  # reads every request, answers none\n")
EXITS = "import sys\nsys.exit(3)\n"
# The real loop; each child runs CHILD (exit 7, die by SIGTERM, or wait for its server to die).
LOOP = f"""
import os, signal, socket, sys, time
sys.path.insert(0, {str(ROOT)!r})
from gpulab.distributed.runtime.forkserver import serve_forks
from gpulab.distributed.runtime.processes import die_with_parent

def become(sock, request, fds):
    what = request["argv"][1]
    if what == "exit 7":
        os._exit(7)
    if what == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    die_with_parent(os.getppid())
    time.sleep(120)  # until the server dies, and it with it
    os._exit(0)

serve_forks(socket.socket(fileno=int(sys.argv[1])), become)
"""


def server_running(code: str, **options) -> ForkServer:
    return ForkServer(command=lambda fd, pid: [sys.executable, "-c", code, str(fd), str(pid)],
                      **options)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def start(server: ForkServer, what: str):
    go_read, go_write = os.pipe()
    try:
        return server.start(["launch-dir", what], dict(os.environ), go_read)
    finally:
        os.close(go_read)
        os.close(go_write)


def finish(rank) -> int:
    code = rank.wait(timeout=60)
    rank.stdout.close()
    rank.stderr.close()
    return code


def test_a_server_that_never_answers_is_given_up_at_the_start_timeout_and_leaks_nothing():
    server = server_running(SILENT, start_timeout_s=0.5)
    try:
        before = open_fds()
        with pytest.raises(OSError, match=r"did not start rank silent \(its exit code: None\)"
                                          r".*GPULAB_FRESH_RANKS=1"):
            start(server, "silent")
        assert open_fds() <= before, "the rank's pipes were closed"
    finally:
        server.close()


def test_a_server_that_died_is_reported_at_once_with_its_exit_code():
    server = server_running(EXITS)  # the default start timeout: two minutes, never reached
    try:
        with pytest.raises(OSError, match=r"its exit code: 3"):
            start(server, "anything")
    finally:
        server.close()


def test_children_report_their_exit_code_or_the_signal_that_killed_them():
    server = server_running(LOOP)
    try:
        assert finish(start(server, "exit 7")) == 7
        assert finish(start(server, "sigterm")) == -signal.SIGTERM
    finally:
        server.close()


def test_a_child_whose_server_was_killed_counts_as_killed():
    server = server_running(LOOP)
    try:
        rank = start(server, "outlive")
        assert rank.poll() is None
        os.kill(server._proc.pid, signal.SIGKILL)
        assert finish(rank) == -signal.SIGKILL  # it died with its server (PR_SET_PDEATHSIG)
    finally:
        server.close()


# ----------------------------------------------------------------------------- the node client


class NodeServer(threading.Thread):
    """A node server of the test's own: answers one client with `pid`, then with `code` (or
    closes the connection there when code is None)."""

    def __init__(self, path: Path, pid: int | None, code: int | None):
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.pid, self.code, self.request = pid, code, None

    def run(self):
        conn, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
        for fd in fds:
            os.close(fd)
        self.request = json.loads(message)
        if self.pid is not None:
            conn.send(json.dumps({"pid": self.pid}).encode())
            if self.code is not None:
                conn.send(json.dumps({"code": self.code}).encode())
        conn.close()


def client(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, node_client.__file__, str(path), *args],
                          capture_output=True, timeout=60)


def test_the_node_client_exits_as_its_process_did(tmp_path):
    stand_in = subprocess.Popen(["sleep", "60"])  # the pid a forked rank would have
    try:
        for code in (0, 5, -signal.SIGTERM):
            path = tmp_path / f"code{code}.sock"
            server = NodeServer(path, stand_in.pid, code)
            server.start()
            assert client(path, "report", "script.py").returncode == code
            server.join(timeout=60)
            assert server.request["kind"] == "rank"
            assert server.request["argv"] == ["report", "script.py"]
    finally:
        stand_in.kill()
        stand_in.wait()


def test_the_node_client_dies_killed_when_its_server_goes_silent(tmp_path):
    path = tmp_path / "silent.sock"
    server = NodeServer(path, pid=os.getpid(), code=None)  # a pid that will not be signalled
    server.start()
    assert client(path, "--agent", "--standalone").returncode == -signal.SIGKILL
    server.join(timeout=60)
    assert server.request["kind"] == "agent" and server.request["argv"] == ["--standalone"]


class Execed(Exception):
    """Where the node client would have replaced itself (os.execv)."""


@pytest.fixture
def caught_exec(monkeypatch):
    """The node client in this process, with exec caught and nothing set on this process."""
    def execv(path, argv):
        raise Execed(argv)

    monkeypatch.setattr(node_client.os, "execv", execv)
    monkeypatch.setattr(node_client, "CONNECT_WAIT_S", 0.2)
    real = node_client._sibling
    monkeypatch.setattr(node_client, "_sibling", lambda name: (
        type("NoDeathSignal", (), {"die_with_parent": staticmethod(lambda pid: None)})
        if name == "processes" else real(name)))


def test_with_no_server_the_node_client_becomes_its_process(tmp_path, caught_exec):
    with pytest.raises(Execed) as rank:
        node_client.main(str(tmp_path / "nobody.sock"), "report", "script.py", "--lr", "1")
    assert rank.value.args[0] == bootstrap.command("torchrun-rank", "report", "script.py",
                                                   "--lr", "1")
    with pytest.raises(Execed) as agent:
        node_client.main(str(tmp_path / "nobody.sock"), "--agent", "--standalone")
    assert agent.value.args[0] == bootstrap.command("agent", os.getppid(), "--standalone")


def test_a_server_gone_before_forking_leaves_the_node_client_to_become_its_process(
        tmp_path, caught_exec):
    path = tmp_path / "gone.sock"
    server = NodeServer(path, pid=None, code=None)  # takes the request, answers nothing
    server.start()
    with pytest.raises(Execed) as rank:
        node_client.main(str(path), "report", "script.py")
    server.join(timeout=60)
    assert rank.value.args[0][3:] == ["torchrun-rank", "report", "script.py"]


def test_bootstrap_knows_its_roles_and_puts_gpulab_on_the_path():
    line = bootstrap.command("rank", Path("/tmp/launch"), 3)
    assert line[:2] == [sys.executable, "-c"] and line[3:] == ["rank", "/tmp/launch", "3"]
    assert repr(bootstrap.PACKAGE_ROOT) in line[2]
    assert (Path(bootstrap.PACKAGE_ROOT) / "gpulab" / "__init__.py").is_file()
    with pytest.raises(ValueError, match="no role 'worker'"):
        bootstrap.command("worker")
    for module, function in bootstrap.ROLES.values():  # each entry point exists (not run)
        assert callable(getattr(importlib.import_module(module), function)), (module, function)
