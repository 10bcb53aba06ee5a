"""What the capstone's loop watches when a preemption notice may come (train.py, Part 4 of the
capstone): every save the learner's code makes, and the state a resume starts from.

    recorder = SaveRecorder(save_checkpoint, record_dir, rank)
    namespace["save_checkpoint"] = recorder       # the learner's calls go through it too
    state_digest(model, optimizer)                # {"model": sha256, "optimizer": sha256}

Each save leaves record_dir/save_rank{R}_step{S}.json: when it began and ended (an end that never
comes is a save the grace period cut short), the digest of what was saved, and whether it was
called from inside the signal handler. A save there is refused: Python runs a handler between
two bytecodes of whatever the main thread was doing, and a checkpoint's collectives started
there would interleave with the collective in flight (FSDP2's all-gather of the step, say),
deadlocking or mixing the two. The caller's stack says it deterministically: the code of the
handler SIGTERM has at that moment is on it. The digests let the checker compare, bit for bit,
the state saved at the notice with the state the requeued run loaded.
Taught in: the capstone (solutions/capstone_distributed_gpt), Part 4
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from pathlib import Path

import torch

IN_HANDLER = "save_checkpoint was called inside the signal handler"  # the refusal's message


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's own part of a tensor (a DTensor's shard), as contiguous CPU memory."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.detach().to("cpu").contiguous()


def state_digest(model, optimizer) -> dict[str, str]:
    """sha256 of this rank's shards of the weights, and of AdamW's state (moments and step
    count), in parameter order: equal digests mean a bit-for-bit equal state."""
    weights, moments = hashlib.sha256(), hashlib.sha256()
    for p in model.parameters():
        weights.update(_local(p).view(torch.uint8).numpy().tobytes())
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            moments.update(key.encode())
            if isinstance(value, torch.Tensor):
                moments.update(_local(value).reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                moments.update(repr(value).encode())
    return {"model": weights.hexdigest(), "optimizer": moments.hexdigest()}


class SaveRecorder:
    """The learner's save_checkpoint, recorded (see the module)."""

    def __init__(self, save_checkpoint, record_dir: Path, rank: int):
        self.save, self.record_dir, self.rank = save_checkpoint, Path(record_dir), rank
        self.__name__ = getattr(save_checkpoint, "__name__", "save_checkpoint")

    @staticmethod
    def _in_handler() -> bool:
        """Whether SIGTERM's handler, as installed now, is among the callers."""
        handler = signal.getsignal(signal.SIGTERM)
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        frame = sys._getframe(2)
        while code is not None and frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def __call__(self, folder, model, optimizer, step):
        record = {"rank": self.rank, "step": step, "began": time.time(), "ended": None,
                  "in_handler": self._in_handler(),
                  "digest": state_digest(model, optimizer)}
        path = self.record_dir / f"save_rank{self.rank}_step{step}.json"
        path.write_text(json.dumps(record))
        if record["in_handler"]:
            raise RuntimeError(f"{IN_HANDLER} (step {step}): refused")
        result = self.save(folder, model, optimizer, step)
        record["ended"] = time.time()
        path.write_text(json.dumps(record))
        return result


def read_saves(record_dir: Path) -> list[dict]:
    """Every save record of a run, ordered by step and rank."""
    records = [json.loads(p.read_text()) for p in Path(record_dir).glob("save_rank*.json")]
    return sorted(records, key=lambda r: (r["step"], r["rank"]))
