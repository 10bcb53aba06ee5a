"""One rank of `run_on_ranks`: a fresh Python process that joins the process group, runs the
function, sends its return value back, and waits for the launcher's word to leave.

The launcher (gpulab/distributed/runtime/launch.py) starts it as
    python -c "<bootstrap.py's LINE>" rank LAUNCH_DIR RANK
and talks to it through files in LAUNCH_DIR and one pipe:

    spec.json           world_size, backend, store address, sys.path, the parent's pid
    payload.pkl         (fn, args, kwargs, before_init), pickled by by_value.py
    rank{N}.status      a small memory-mapped line "phase|since|detail", rewritten in place,
                        so the launcher can say where a hung rank is waiting
    rank{N}.stack       its Python stacks, written by faulthandler on STACK_SIGNAL
    rank{N}.result      ("ok", value) or ("error", phase, type, message, traceback, exception)
    the "go" pipe       end of file means: every rank has a result, leave now (or, before this
                        rank has finished, that the launcher is gone: exit at once)

Why wait for "go" instead of exiting after returning: a rank that leaves early closes its
connections, and a peer still inside a collective with it would then fail with a confusing
"connection closed" instead of hanging visibly where the bug is.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import mmap
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

STATUS_BYTES = 512
PHASES = ("boot", "load", "init", "run", "wait", "done")  # in order; "wait" = inside a collective
# The torch.distributed calls a rank can block in; each is wrapped to record where it waits.
# isend/irecv are left alone: they return at once (the wait is in work.wait(), which the stack
# dump shows), and P2POp accepts only the original functions.
WATCHED = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "all_gather_single", "all_gather_object", "gather", "gather_object", "scatter",
           "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor",
           "reduce_scatter_single", "all_to_all", "all_to_all_single", "barrier",
           "monitored_barrier", "broadcast_object_list", "send", "recv", "batch_isend_irecv",
           "send_object_list", "recv_object_list")


class StatusBoard:
    """A fixed-size memory-mapped line that one rank writes and the launcher reads."""

    def __init__(self, path: Path, create: bool = False):
        if create:
            path.write_bytes(b"\0" * STATUS_BYTES)
        self._file = open(path, "r+b")  # noqa: SIM115 - kept open for the mapping's life
        self._map = mmap.mmap(self._file.fileno(), STATUS_BYTES)

    def set(self, phase: str, detail: str = "") -> None:
        line = f"{phase}|{time.time():.3f}|{detail}".encode()[: STATUS_BYTES - 1]
        self._map[:] = line.ljust(STATUS_BYTES, b"\0")

    def get(self) -> tuple[str, float, str]:
        """(phase, since, detail); ("boot", 0, "") before the rank wrote anything."""
        return _parse_status(bytes(self._map))

    def close(self) -> None:
        self._map.close()
        self._file.close()


def read_status(path: Path) -> tuple[str, float, str]:
    """A rank's (phase, since, detail), read from its file without mapping it: safe while a
    restarted rank rewrites the file (a mapping would fault on the truncated file). ("boot", 0,
    "") while the file is missing or empty."""
    try:
        return _parse_status(path.read_bytes())
    except FileNotFoundError:
        return "boot", 0.0, ""


def _parse_status(raw: bytes) -> tuple[str, float, str]:
    text = raw.rstrip(b"\0").decode(errors="replace")
    phase, _, rest = text.partition("|")
    since, _, detail = rest.partition("|")
    try:
        return (phase or "boot"), float(since or 0), detail
    except ValueError:  # read while being rewritten: ask again next time
        return "boot", 0.0, ""


def describe(board: StatusBoard) -> str:
    """What a rank is doing, in words: 'waiting in all_reduce (called at cell.py:5) for 3.1 s'."""
    return describe_status(*board.get())


def describe_status(phase: str, since: float, detail: str) -> str:
    """describe() of a status read with read_status."""
    age = f" for {time.time() - since:.1f} s" if since else ""
    return {"boot": "starting Python and importing", "load": "loading the function",
            "init": "joining the process group (init_process_group)",
            "wait": f"waiting in {detail}{age}",
            "run": f"running ({detail})" if detail else "running",
            "done": "finished"}.get(phase, phase)


def watch_collectives(dist, board: StatusBoard) -> None:
    """Wrap torch.distributed's blocking calls so the status line says which one a rank is in.

    Only the `torch.distributed.<name>` attributes are replaced, in this rank process only: code
    that calls `dist.all_reduce(...)` goes through the wrapper, and nothing else changes.
    """

    def wrap(name, original):
        @functools.wraps(original)
        def watched(*args, **kwargs):
            caller = sys._getframe(1)
            where = f"{name}{_peer(name, args, kwargs)} (called at " \
                    f"{caller.f_code.co_filename}:{caller.f_lineno})"
            board.set("wait", where)
            try:
                return original(*args, **kwargs)
            finally:
                board.set("run", f"last call: {where}")

        return watched

    for name in WATCHED:
        original = getattr(dist, name, None)
        if original is not None:
            setattr(dist, name, wrap(name, original))


def _peer(name, args, kwargs) -> str:
    """" to rank 1" for a send, " from rank 0" for a recv, "" otherwise."""
    if name in ("send", "send_object_list"):
        dst = kwargs.get("dst", args[1] if len(args) > 1 else None)
        return f" to rank {dst}" if dst is not None else ""
    if name in ("recv", "recv_object_list"):
        src = kwargs.get("src", args[1] if len(args) > 1 else None)
        return f" from rank {src}" if src is not None else ""
    return ""


def _write_result(launch_dir: Path, rank: int, result: tuple) -> None:
    from gpulab.distributed.runtime import by_value

    try:
        data = by_value.dumps(result)
    except Exception as error:  # noqa: BLE001 - an unpicklable return value becomes an error
        data = by_value.dumps(("error", "return", type(error).__name__, str(error),
                              f"the return value of rank {rank} could not be sent back: {error}",
                              None, time.time()))
    tmp = launch_dir / f"rank{rank}.result.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, launch_dir / f"rank{rank}.result")  # the launcher never sees half a file


def _error(phase: str, error: BaseException) -> tuple:
    tb = error.__traceback__.tb_next if error.__traceback__ else None  # drop this file's frame
    text = "".join(traceback.format_exception(type(error), error, tb))
    try:
        from gpulab.distributed.runtime import by_value

        by_value.loads(by_value.dumps(error))
        exc = error
    except Exception:  # noqa: BLE001 - the text is enough when the object cannot travel
        exc = None
    return ("error", phase, type(error).__name__, str(error), text, exc, time.time())


def main(launch_dir: str, rank_text: str, go_fd: int | None = None,
         parent_pid: int | None = None) -> None:
    """Run rank `rank_text` of the launch in `launch_dir`. A rank forked by the fork server
    (forkserver.py) names its own "go" pipe and parent: the spec's are the launcher's."""
    launch_dir, rank = Path(launch_dir), int(rank_text)
    spec = json.loads((launch_dir / "spec.json").read_text())
    from gpulab.distributed.runtime.processes import STACK_SIGNAL, die_with_parent

    die_with_parent(spec["parent_pid"] if parent_pid is None else parent_pid)
    board = StatusBoard(launch_dir / f"rank{rank}.status")
    finished, go = threading.Event(), threading.Event()

    def watch_parent():  # end of file on the pipe: "go" once finished, else the launcher is gone
        with os.fdopen(spec["go_fd"] if go_fd is None else go_fd, "rb", buffering=0) as pipe:
            pipe.read()
        if not finished.is_set():
            os._exit(3)
        go.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    stack_file = open(launch_dir / f"rank{rank}.stack", "w")  # noqa: SIM115 - for faulthandler
    if STACK_SIGNAL is not None:
        faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    sys.path[:] = [*spec["sys_path"], *[p for p in sys.path if p not in spec["sys_path"]]]
    import gpulab  # noqa: F401 - decides the runner (and Numba's simulator) before user code

    board.set("load", "unpickling the function")
    try:
        from gpulab.distributed.runtime import by_value

        fn, args, kwargs, before_init = by_value.loads((launch_dir / "payload.pkl").read_bytes())
        board.set("init", "init_process_group")
        import torch.distributed as dist

        if before_init is not None:
            before_init(rank, spec["world_size"])
        timeout = timedelta(seconds=spec["pg_timeout_s"])
        store = dist.TCPStore(spec["store_host"], spec["store_port"], is_master=False,
                              timeout=timeout)
        device_id = None
        if spec["backend"] == "nccl":
            import torch

            device_id = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device_id)
        dist.init_process_group(spec["backend"], store=store, rank=rank,
                                world_size=spec["world_size"], timeout=timeout,
                                device_id=device_id)
        watch_collectives(dist, board)
    except BaseException as error:  # noqa: BLE001 - reported to the launcher, which decides
        phase = "load" if board.get()[0] == "load" else "start"
        result = _error(phase, error)
    else:
        board.set("run")
        try:
            result = ("ok", fn(rank, spec["world_size"], *args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - SystemExit included: report, not vanish
            result = _error("run", error)
    _write_result(launch_dir, rank, result)
    board.set("done", "finished, waiting for the other ranks")
    finished.set()
    go.wait()
    if result[0] == "ok":
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result[0] == "ok" else 1)  # skip interpreter teardown: nothing is left to do

