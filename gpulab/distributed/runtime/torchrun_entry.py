"""What each torchrun worker runs before the learner's script (see torchrun.py), and torchrun's
agent itself (run_agent), both started by bootstrap.py:

    torchrun ... -m gpulab.distributed.runtime.bootstrap torchrun-rank REPORT_DIR script.py ARGS

It dies with its parent (the torchrun agent), records where it waits (the status line of
worker.py, in REPORT_DIR: "init" inside init_process_group, which the launchers count as
start-up), registers a stack dump on STACK_SIGNAL (SIGUSR2), then runs script.py as
`python script.py ARGS` would. An uncaught exception is written to REPORT_DIR/rank{N}.error
(time, type, traceback) so the caller can name the rank that failed first, and printed without
the "[rankN]:" prefix that torch's own hook would add. Its node (GPULAB_NODE, which
LocalCluster sets per node) goes to REPORT_DIR/rank{N}.node and its exit code, when it leaves
through Python (a return, sys.exit, an exception), to REPORT_DIR/rank{N}.exit: its agent's
exit status alone does not say which code each rank chose (a requeue, see notice.py).
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

RAISED_STARTING = "raised in init_process_group"  # status detail of a rank that never joined


def _user_traceback(error: BaseException) -> str:
    """The traceback from the script's first frame: this file and runpy are left out."""
    tb = error.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def watch_init(dist, board) -> None:
    """Wrap dist.init_process_group so the status line says "init" while the rank joins the
    group: the launchers count that as start-up, not as the script's run time. (A group that
    init_device_mesh starts by itself goes unseen: there joining counts as run time.)"""
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        board.set("init", "init_process_group")
        result = original(*args, **kwargs)  # on an exception the phase stays "init"
        board.set("run", "joined the process group")
        return result

    dist.init_process_group = init_process_group


def run_agent(launcher_pid: str, *torchrun_args: str) -> None:
    """torchrun's agent (`python -m torch.distributed.run ARGS`), which dies with the launcher
    (PR_SET_PDEATHSIG) before torchrun's own code starts."""
    from gpulab.distributed.runtime.processes import die_with_parent

    die_with_parent(int(launcher_pid))
    sys.argv = ["torchrun", *torchrun_args]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


def main(report_dir: str, script: str, *args: str) -> None:
    """One rank: report where it is, then run `script` with `args` as `python script.py` would.
    Its imports of gpulab (below) decide the runner before the script imports numba.cuda."""
    from gpulab.distributed.runtime.processes import STACK_SIGNAL, die_with_parent
    from gpulab.distributed.runtime.worker import StatusBoard, watch_collectives

    die_with_parent(os.getppid())
    report, rank = Path(report_dir), int(os.environ.get("RANK", "0"))
    board = StatusBoard(report / f"rank{rank}.status", create=True)
    (report / f"rank{rank}.pid").write_text(str(os.getpid()))
    (report / f"rank{rank}.node").write_text(os.environ.get("GPULAB_NODE", ""))
    stack_file = open(report / f"rank{rank}.stack", "w")  # noqa: SIM115 - for faulthandler
    if STACK_SIGNAL is not None:
        faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    import torch.distributed as dist

    watch_init(dist, board)
    watch_collectives(dist, board)
    board.set("run")
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` does
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        board.set("done", "exited")
        _write_exit(report, rank, _code_of(done))
        raise
    except BaseException as error:  # noqa: BLE001 - reported, then the rank exits with 1
        text = _user_traceback(error)
        (report / f"rank{rank}.error").write_text(json.dumps({
            "time": time.time(), "type": type(error).__name__, "message": str(error),
            "traceback": text}))
        sys.stderr.write(text)
        sys.stderr.flush()
        # Raised while joining the group: still start-up to the launchers (a start failure).
        board.set("done", RAISED_STARTING if board.get()[0] == "init" else "raised")
        _write_exit(report, rank, 1)
        raise SystemExit(1) from None
    board.set("done", "finished")
    _write_exit(report, rank, 0)


def _code_of(done: SystemExit) -> int:
    """The status sys.exit(code) leaves with: None is 0, a message is 1."""
    if done.code is None:
        return 0
    return done.code if isinstance(done.code, int) else 1


def _write_exit(report: Path, rank: int, code: int) -> None:
    (report / f"rank{rank}.exit").write_text(str(code))

