"""JupyterLab started by the Makefile's own recipe, for tests that talk to it.

    with running_lab("lab", root_dir=tmp_path, runtime_dir=tmp_path / "rt") as lab:
        lab.page_config()["disabledExtensions"]     what this JupyterLab page turns off
        lab.status("/formgrader")                   an HTTP status code
        lab.url("lab/tree/scratch.ipynb")           an address a browser can open (token in it)

`make lab` (the learner's) and `make lab-instructor` differ only in what they switch on, so the
tests start the very recipe the README tells people to type: `make -o STAMP` skips the install
step (the running interpreter's environment is the course's) and JUPYTER_ARGS adds a free port,
a token and the folder to serve. The server and everything it started are stopped on the way
out, whatever happened inside. Not a test module: test_lab_roles and test_browser import it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "gpulab-test"
PAGE_CONFIG = re.compile(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                         re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LabServer:
    """A running JupyterLab: where it listens and the token that lets a client in."""

    port: int
    token: str

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}?token={self.token}"

    def status(self, path: str) -> int:
        """The HTTP status of a GET of `path` (404 for a handler that is not loaded)."""
        try:
            with urllib.request.urlopen(self.url(path), timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code

    def page_config(self) -> dict:
        """The configuration JupyterLab's page hands its frontend (disabledExtensions, ...)."""
        with urllib.request.urlopen(self.url("lab"), timeout=10) as response:
            html = response.read().decode()
        return json.loads(PAGE_CONFIG.search(html).group(1))


def lab_command(target: str, port: int, root_dir: Path) -> list[str]:
    """`make TARGET` for the environment running these tests, on `port`, serving `root_dir`."""
    prefix = Path(sys.prefix)
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    return ["make", "--no-print-directory", "-o", str(prefix / ".gpulab-installed"), target,
            f"VENV={prefix}", f"LAB_ROOT={root_dir}", f"JUPYTER_ARGS={args}"]


@contextmanager
def running_lab(target: str, root_dir: Path, runtime_dir: Path,
                timeout: float = 90) -> Iterator[LabServer]:
    """Start `make TARGET` ("lab" or "lab-instructor"), wait until it answers, stop it after."""
    port = free_port()
    runtime_dir.mkdir(parents=True, exist_ok=True)
    log = runtime_dir / f"{target}.log"  # a file, not a pipe: a full pipe would stall the server
    # Its runtime files, workspaces and settings in runtime_dir: nothing of the user's is read
    # (a restored tab, a changed shortcut) or written.
    environ = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime_dir),
                   JUPYTERLAB_WORKSPACES_DIR=str(runtime_dir / "workspaces"),
                   JUPYTERLAB_SETTINGS_DIR=str(runtime_dir / "settings"))
    with log.open("w") as out:
        server = subprocess.Popen(lab_command(target, port, root_dir), cwd=ROOT, env=environ,
                                  stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # its own group: stopped as one
    lab = LabServer(port, TOKEN)
    try:
        deadline = time.monotonic() + timeout
        while lab_status(lab) != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                stop(server)
                raise RuntimeError(f"`make {target}` never answered:\n{log.read_text()}")
            time.sleep(0.5)
        yield lab
    finally:
        stop(server)


def lab_status(lab: LabServer) -> int | None:
    try:
        return lab.status("api/status")
    except OSError:  # not listening yet
        return None


def stop(server: subprocess.Popen) -> None:
    """Stop the server's whole process group (jupyter shuts down on SIGTERM without asking)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    try:
        os.killpg(server.pid, signal.SIGKILL)  # kernels it started and left behind, if any
    except ProcessLookupError:
        pass
