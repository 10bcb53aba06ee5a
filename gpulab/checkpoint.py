"""Training checkpoints that resume bit for bit (not activation checkpointing: see gpulab.memory).

A resumed run continues exactly as if it had never stopped only if it restores everything that
decides the next step: the weights, the optimizer's moments, the GradScaler's scale, every random
number generator (dropout, data augmentation, shuffling), and where the data loader was.

    TrainState          step counter, loader position, loss history, RNG states
    capture_rng_state / restore_rng_state   torch CPU, CUDA/XPU/MPS, NumPy, Python `random`
    save_checkpoint / load_checkpoint       one file, written atomically, read with weights_only

Taught in: lessons/03_pytorch_on_the_gpu.ipynb (checkpoints), lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

FORMAT = 1  # bumped when the file layout changes, so an old file fails with a clear message


def _accelerators():
    """(name, module) for each accelerator whose generators exist in this process."""
    found = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        found.append(("cuda", torch.cuda))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available() and xpu.is_initialized():
        found.append(("xpu", xpu))
    return found


def capture_rng_state() -> dict:
    """Every generator a training step may draw from, as plain tensors, ints and lists."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        # NumPy's state holds an ndarray, which torch.load(weights_only=True) refuses: store ints.
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    for name, module in _accelerators():
        state[name] = module.get_rng_state_all()  # one generator per device
    mps = getattr(torch, "mps", None)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() and mps:
        state["mps"] = mps.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what capture_rng_state returned."""
    # Generator states must be CPU byte tensors, whatever map_location the checkpoint was read with.
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))  # lists come back where tuples went
    for name, module in _accelerators():
        if name in state:
            module.set_rng_state_all([t.cpu() for t in state[name]])
    if "mps" in state:
        torch.mps.set_rng_state(state["mps"].cpu())


@dataclass
class TrainState:
    """Where a training run is, apart from the model, optimizer and scaler."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # the loader pass the next micro-batch comes from
    batch_in_epoch: int = 0  # micro-batches already taken from that pass
    losses: list[float] = field(default_factory=list)  # one per optimizer step, from step 0
    # torch's CPU generator (and the loader's own generator, if any) when the current pass
    # began: DataLoader draws its shuffle and worker seeds from them as the pass starts.
    epoch_rng: dict = field(default_factory=dict)
    rng: dict = field(default_factory=dict)  # every generator, captured at save time


def save_checkpoint(path, model, optimizer, scaler, state: TrainState) -> Path:
    """Write model, optimizer, scaler and `state` (with fresh RNG states) to `path`.

    The file is written next to its final name and renamed into place: a run killed while
    saving leaves the previous checkpoint whole instead of a truncated file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state.rng = capture_rng_state()
    payload = {
        "format": FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else {},
        "state": asdict(state),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic on POSIX and Windows
    return path


def load_checkpoint(path, model, optimizer, scaler, map_location="cpu") -> TrainState:
    """Load what save_checkpoint wrote into `model`, `optimizer`, `scaler`; return the state.

    The RNG states are returned in the TrainState, not restored: the trainer first replays the
    data loader's position and then restores them (see gpulab.train).
    """
    # weights_only: a checkpoint is a pickle, and unpickling arbitrary objects can run code.
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a gpulab checkpoint of format {FORMAT} "
                         f"(found {payload.get('format')!r}); start a fresh run.")
    model.load_state_dict(payload["model"])  # first: the optimizer's state follows the params
    optimizer.load_state_dict(payload["optimizer"])
    if scaler is not None and payload["scaler"]:
        scaler.load_state_dict(payload["scaler"])
    return TrainState(**payload["state"])
