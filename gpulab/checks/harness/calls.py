"""What the learner's code asks of torch.distributed, recorded on a rank (for Lab 3's checkers).

    log = CallLog(log_path(log_dir, rank))
    with log.recording():                 # dist.all_reduce & co. now record, then call through
        ring_all_reduce(x, "sum")
    log.calls    [{"call": "send", "numel": 4, "phase": ..., "async": False, ...}, ...]

Recorded: every collective and blocking message by name, with the size of its tensor, the phase
the checker was in (a case's label, "backward", "finish"...), whether it was asynchronous and
whether its handle was waited for; every point-to-point message the rank sends, however it was
posted (send, isend, batch_isend_irecv: all go through ProcessGroup.send), with its size; and
calls into code the learner may not borrow (gpulab's own all-reduce or DDP, torch's
DistributedDataParallel). Each event is also a JSON line in a file,
flushed at once, which the checker reads when the ranks hang or crash (read_logs).
The originals are read when a recording starts, before the learner's code runs in it, so code
that replaces dist.all_reduce cannot change what is recorded. Shipped to the ranks by value,
like the labs' rank modules (lab3/ranks.py, lab5/ranks.py): nothing here may import the
checkers around it.
"""

from __future__ import annotations

import inspect
import json
import os
import sys

import torch
import torch.distributed as dist

# Collectives a ring may not use (barrier is allowed: it moves no data).
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_to_all", "all_to_all_single",
               "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list", "all_reduce_coalesced", "barrier")
# The argument that holds a collective's whole data, where it is not the first tensor: an
# all-gather's output, a reduce-scatter's input (the others' first tensor is the whole).
WHOLE_DATA = {"all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor",
              "all_gather_single": "output_tensor", "reduce_scatter": "input_list",
              "reduce_scatter_tensor": "input", "reduce_scatter_single": "input"}
# isend and irecv are left alone: P2POp accepts only the original functions.
POINT_TO_POINT = ("send", "recv", "batch_isend_irecv")
# Code the learner's code may not run: (part of its path, whose it is). The launcher's own code in
# gpulab/distributed/ (it wraps dist.* to tell where a rank waits) is not the learner's doing.
BORROWED = (("/gpulab/distributed/", "gpulab's own"),
            ("/torch/nn/parallel/distributed.py", "torch's DistributedDataParallel"))
LAUNCHER_FILES = ("runtime/worker.py", "runtime/by_value.py", "runtime/processes.py")


class CallLog:
    """torch.distributed calls made while `recording`, in order, with the phase they came in.

    Each call is a dict: call (its name), phase ("backward", "finish", a case's label...), step,
    numel, dtype and device type (of its first tensor), bytes (of the whole data it reduces,
    gathers or broadcasts: WHOLE_DATA), async (async_op=True), waited (its
    handle's wait() was called), pending (gradients not yet computed, when the checker counts
    them). Every event is also a JSON line in `path`, flushed at once: a checker reads it after
    a hang or a crash.
    """

    def __init__(self, path: str | None = None):
        self.calls: list[dict] = []
        self.borrowed: list[str] = []  # "gpulab's own code (allreduce.py: ring_all_reduce)"
        self.sent: list[dict] = []  # each message this rank sent: {"phase", "numel", "dst"}
        self.phase, self.step = "setup", 0
        self.pending = None  # callable: gradients still to come in this backward, or None
        # Inside a recorded call: a TorchFunctionMode (torch.device("meta") as a context) sends
        # the collective through dist.<name> once more, and that is the same call.
        self._inside = False
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - kept open

    def set_phase(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        self.step = self.step if step is None else step
        self._write({"phase": phase, "step": self.step})

    def _write(self, event: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")

    def recording(self, profile: bool = True):
        """A context: dist's collectives and messages recorded, and (profile) calls into
        borrowed code noted, until it ends."""
        return _Recording(self, profile)

    def _record(self, name: str, original, signature, args, kwargs):
        if self._inside:
            return original(*args, **kwargs)
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments if signature else {}
        except TypeError:
            bound = {}
        tensor = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if tensor is None:  # all_gather(tensor_list, tensor): a list comes first
            tensor = next((t for a in args if isinstance(a, list | tuple) for t in a
                           if isinstance(t, torch.Tensor)), None)
        call = {"call": name, "phase": self.phase, "step": self.step, "index": len(self.calls),
                "numel": None if tensor is None else int(tensor.numel()),
                "dtype": None if tensor is None else str(tensor.dtype).removeprefix("torch."),
                "device": None if tensor is None else tensor.device.type,
                "bytes": _whole_bytes(bound.get(WHOLE_DATA.get(name, ""), tensor)),
                "async": bool(bound.get("async_op", False)), "waited": False,
                "pending": None if self.pending is None else int(self.pending())}
        self.calls.append(call)
        self._write(call)
        self._inside = True
        try:
            work = original(*args, **kwargs)
        finally:
            self._inside = False
        return Handle(work, call, self) if call["async"] and work is not None else work

    def _sent(self, tensors, dst) -> None:
        self.sent.append({"phase": self.phase, "dst": dst,
                          "numel": sum(int(t.numel()) for t in tensors)})

    def _profile(self, frame, event, arg) -> None:
        if event != "call" or len(self.borrowed) >= 3:
            return
        path = frame.f_code.co_filename.replace("\\", "/")
        for part, whose in BORROWED:
            if part in path and not path.endswith(LAUNCHER_FILES):
                where = f"{whose} code ({path.rsplit('/', 1)[-1]}: {frame.f_code.co_name})"
                if where not in self.borrowed:
                    self.borrowed.append(where)
                    self._write({"borrowed": where})


class _Recording:
    """Replaces dist.<name> (and distributed_c10d.<name>) by recording versions; puts the
    originals back at the end. The originals are read when the recording starts."""

    def __init__(self, log: CallLog, profile: bool):
        self.log, self.profile, self.saved = log, profile, []

    def __enter__(self):
        import torch.distributed.distributed_c10d as c10d

        for module in (dist, c10d):
            for name in (*COLLECTIVES, *POINT_TO_POINT):
                original = getattr(module, name, None)
                if original is None:
                    continue
                self.saved.append((module, name, original))
                setattr(module, name, _recorder(self.log, name, original))
        self._send = dist.ProcessGroup.send  # where every message goes, blocking or not
        dist.ProcessGroup.send = _send_recorder(self.log, self._send)
        if self.profile:
            self.saved_profile = sys.getprofile()
            sys.setprofile(self.log._profile)
        return self.log

    def __exit__(self, *exc):
        if self.profile:
            sys.setprofile(self.saved_profile)
        dist.ProcessGroup.send = self._send
        for module, name, original in reversed(self.saved):
            setattr(module, name, original)
        return False


def _whole_bytes(data) -> int | None:
    """Bytes of a tensor, or of a list of tensors (an all-gather's list): None for anything
    else (no tensor: a barrier, an object collective)."""
    tensors = data if isinstance(data, list | tuple) else [data]
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    return sum(int(t.numel()) * t.element_size() for t in tensors)


def _recorder(log: CallLog, name: str, original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def recorded(*args, **kwargs):
        return log._record(name, original, signature, args, kwargs)

    recorded.__name__ = recorded.__qualname__ = name
    recorded.__doc__ = getattr(original, "__doc__", None)
    return recorded


def _send_recorder(log: CallLog, original):
    """ProcessGroup.send that notes each message's size: isend and P2POp must stay torch's own
    functions (P2POp checks), so messages are counted where they all meet."""

    def send(group, tensors, dst, *args, **kwargs):
        log._sent(tensors, dst)
        return original(group, tensors, dst, *args, **kwargs)

    return send


class Handle:
    """What an asynchronous collective returns, as the learner sees it: the real handle, which
    notes when it is waited for (wait(), or a finished is_completed() / get_future())."""

    def __init__(self, work, call: dict, log: CallLog):
        self._work, self._call, self._log = work, call, log

    def _waited(self) -> None:
        if not self._call["waited"]:
            self._call["waited"] = True
            self._log._write({"waited": self._call["index"]})

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._waited()
        return result

    def is_completed(self):
        done = self._work.is_completed()
        if done:
            self._waited()
        return done

    def get_future(self):
        future = self._work.get_future()
        self._waited()  # the learner waits on the future: torch.futures.wait_all([...])
        return future

    def __getattr__(self, name):
        return getattr(self._work, name)


def log_path(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"rank{rank}.log")


def read_logs(log_dir: str, world_size: int) -> dict[int, list[dict]]:
    """Each rank's events, as ddp_rank and ring_rank wrote them (for a checker, after a hang)."""
    logs = {}
    for rank in range(world_size):
        path = log_path(log_dir, rank)
        events = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        events.append(json.loads(line))
                    except ValueError:  # a line cut by the kill
                        break
        logs[rank] = events
    return logs
