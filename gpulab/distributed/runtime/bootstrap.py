"""Where every process of the runtime starts: one command line, and one entry point per role.

    command("rank", launch_dir, 0)   [python, -c, LINE, "rank", launch_dir, "0"]
    enter("rank", [launch_dir, "0"], go_fd=5, parent_pid=123)   # in a child forked by a server

LINE puts the folder that holds gpulab on sys.path and calls main(), which runs the role named
by its first argument. Where gpulab is on the path already (torchrun's ranks: their PYTHONPATH
has it), `python -m gpulab.distributed.runtime.bootstrap ROLE ARGS` is the same. A process
forked by a warm server (forkserver.py, nodeserver.py) calls enter() with the same role.

ROLES names each role's entry point by module and function (text, so that this module imports
none of the runtime, and none of it imports back), each called with the role's arguments as text:

role           what the process becomes                       started by
rank           one rank of run_on_ranks (worker.py)           launch.py, or forkserver.py's fork
forkserver     run_on_ranks' warm server                      forkserver.py
nodeserver     a LocalCluster node's warm server              nodeserver.py
agent          torchrun's agent, dying with LAUNCHER_PID      torchrun.py, cluster.py, nodeserver.py
torchrun-rank  one rank under torchrun (torchrun_entry.py)    torchrun's agent, node_client.py

Standard library only: node_client.py loads this file by its path.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# The folder that holds the gpulab package: LINE puts it on each child's sys.path.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
LINE = ("import sys; sys.path.insert(0, {root!r}); "
        "from gpulab.distributed.runtime.bootstrap import main; main()")
MODULE = "gpulab.distributed.runtime.bootstrap"
# What torchrun runs for each rank in a fresh interpreter: its PYTHONPATH holds PACKAGE_ROOT.
TORCHRUN_RANK = ("-m", MODULE, "torchrun-rank")
RUNTIME = "gpulab.distributed.runtime"
ROLES = {  # role -> (module, function)
    "rank": (f"{RUNTIME}.worker", "main"),
    "forkserver": (f"{RUNTIME}.forkserver", "serve"),
    "nodeserver": (f"{RUNTIME}.nodeserver", "serve"),
    "agent": (f"{RUNTIME}.torchrun_entry", "run_agent"),
    "torchrun-rank": (f"{RUNTIME}.torchrun_entry", "main"),
}


def command(role: str, *args) -> list[str]:
    """The command line of a fresh process in `role`, with `args` (made text)."""
    if role not in ROLES:
        raise ValueError(f"no role {role!r}; the roles are {sorted(ROLES)}")
    return [sys.executable, "-c", LINE.format(root=PACKAGE_ROOT), role, *map(str, args)]


def main(argv: list[str] | None = None) -> None:
    """Run the role named by the first argument with the others (default: sys.argv)."""
    role, *args = sys.argv[1:] if argv is None else argv
    enter(role, args)


def enter(role: str, args: list[str], **forked) -> None:
    """Become `role` with `args`; `forked`: what a server's child passes to its rank (the
    rank's own "go" pipe and parent)."""
    module, function = ROLES[role]
    getattr(importlib.import_module(module), function)(*args, **forked)


if __name__ == "__main__":
    main()
