"""Lab 2, Part 4: a snapshot that resumes training exactly (check_resume).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""

from __future__ import annotations

import copy
import io

import torch
import torch.nn.functional as F

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import (
    call_learner,
    make_scaler,
    one_thread,
    param_copies,
    tiny_problem,
)

# ----------------------------------------------------------------------------- Part 4

RESUME_BATCH = 8  # examples per step, drawn with torch's generator (as a shuffle would)


def _resume_setup(seed: int):
    """Training with every kind of state a resume must restore: dropout and the data order
    (torch's RNG), AdamW's moments, a GradScaler whose scale has moved."""
    model, x, y = tiny_problem(seed, n=48, dropout=0.25)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, make_scaler(True, growth_interval=2), (x, y)


def _resume_step(model, optimizer, scaler, data) -> torch.Tensor:
    x, y = data
    idx = torch.randint(0, len(y), (RESUME_BATCH,))
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[idx]), y[idx])  # fp32: the run is compared bit for bit
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def _capture(model, optimizer, scaler) -> dict:
    return {"params": param_copies(model),
            "optimizer": copy.deepcopy(optimizer.state_dict()["state"]),
            "scaler": scaler.state_dict(), "rng": torch.get_rng_state()}


def _same(a, b) -> bool:
    """Equal, bit for bit, through nested dicts, lists and tuples of tensors and numbers."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))
    return a == b


def _round_trip(snap, case: str):
    """The snapshot as a new process reads it: torch.save, then torch.load(weights_only)."""
    buffer = io.BytesIO()
    try:
        torch.save(snap, buffer)
    except Exception as error:
        raise AssertionError(f"snapshot ({case}): torch.save could not write what snapshot "
                             f"returned ({type(error).__name__}: {error}).") from error
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as error:
        lines = str(error).splitlines()
        why = next((s.strip() for s in lines if "Unsupported global" in s), lines[0] if lines
                   else "")[:160]
        raise AssertionError(
            f"snapshot ({case}): torch.load(..., weights_only=True) refused it ({why}). Keep "
            "only tensors, numbers, strings, lists and dicts in it (state_dict()s, "
            "torch.get_rng_state()): anything else needs pickle, which can run code hidden in "
            "a file.") from error


def _holds_scaler_state(tree) -> bool:
    """True when a GradScaler's state_dict() is somewhere in the (loaded) snapshot."""
    if isinstance(tree, dict):
        return {"scale", "_growth_tracker"} <= tree.keys() or any(
            _holds_scaler_state(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return any(_holds_scaler_state(v) for v in tree)
    return False


def _check_restored(got: dict, want: dict, later: dict, fresh: dict, loaded, case: str) -> None:
    where = f"restore ({case})"
    if not _same(got["params"], want["params"]):
        if _same(got["params"], later["params"]):
            raise AssertionError(
                f"{where}: the weights are those from the end of the run, not from the "
                "snapshot: model.state_dict() holds the live parameters, which training went "
                "on changing. Store copies: copy.deepcopy(model.state_dict()).")
        hint = ("the model kept its own fresh weights: load the snapshot's with "
                "model.load_state_dict(...)." if _same(got["params"], fresh["params"]) else
                "they differ from the model's at the snapshot.")
        raise AssertionError(f"{where}: the weights were not restored: {hint}")
    if not _same(got["optimizer"], want["optimizer"]):
        if _same(got["optimizer"], later["optimizer"]):
            raise AssertionError(
                f"{where}: the optimizer state is the one from the end of the run: "
                "optimizer.state_dict() refers to the tensors each step updates in place. "
                "Store a copy: copy.deepcopy(optimizer.state_dict()).")
        raise AssertionError(
            f"{where}: the optimizer's state was not restored. AdamW keeps, for every "
            "parameter, two running averages (exp_avg, exp_avg_sq) and a step count, and the "
            "next steps depend on them: store optimizer.state_dict() in the snapshot and load "
            "it with optimizer.load_state_dict().")
    got_s, want_s = got["scaler"], want["scaler"]
    if (got_s.get("scale"), got_s.get("_growth_tracker")) != (want_s["scale"],
                                                               want_s["_growth_tracker"]):
        missing = ("the snapshot holds no GradScaler state" if not _holds_scaler_state(loaded)
                   else "the snapshot holds the GradScaler's state, but restore did not load it")
        raise AssertionError(
            f"{where}: the GradScaler was not restored: scale {got_s.get('scale')}, growth "
            f"tracker {got_s.get('_growth_tracker')}; at the snapshot they were "
            f"{want_s['scale']} and {want_s['_growth_tracker']} ({missing}). Store "
            "scaler.state_dict() and load it with scaler.load_state_dict(); otherwise a resumed "
            "fp16 run restarts its scale and loses steps finding it again.")
    if not torch.equal(got["rng"], want["rng"]):
        raise AssertionError(
            f"{where}: torch's random state was not restored. Dropout masks and the order of "
            "the batches come from it, so the resumed run would draw other ones: store "
            "torch.get_rng_state() and put it back with torch.set_rng_state() (on a CUDA GPU, "
            "torch.cuda.get_rng_state_all() too).")


@one_thread()
def check_resume(snapshot, restore, steps_before: int = 3, steps_after: int = 3,
                 seed: int = 0) -> None:
    """snapshot(model, optimizer, scaler, step) -> a copy of everything the next step depends
    on; restore(snap, model, optimizer, scaler) -> step puts it into fresh objects. After a
    round trip through torch.save and torch.load(weights_only=True), the resumed run must
    repeat the uninterrupted one bit for bit: same losses, same weights."""
    require_own_function(snapshot, "snapshot")
    require_own_function(restore, "restore")
    case = f"snapshot after {steps_before} steps, then {steps_after} more"
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state is left alone
        torch.manual_seed(seed)
        model, optimizer, scaler, data = _resume_setup(seed)
        for _ in range(steps_before):
            _resume_step(model, optimizer, scaler, data)
        want = _capture(model, optimizer, scaler)
        snap = call_learner(snapshot, "snapshot", model, optimizer, scaler, steps_before, case=case)
        want_losses = [_resume_step(model, optimizer, scaler, data) for _ in range(steps_after)]
        later = _capture(model, optimizer, scaler)
        loaded = _round_trip(snap, case)

        model2, optimizer2, scaler2, _ = _resume_setup(seed + 1)  # a new process: other weights
        fresh = _capture(model2, optimizer2, scaler2)
        torch.manual_seed(seed + 1000)  # ...and its own random state
        step = call_learner(restore, "restore", loaded, model2, optimizer2, scaler2, case=case)
        if isinstance(step, bool) or not isinstance(step, int) or step != steps_before:
            raise AssertionError(
                f"restore ({case}) returned {step!r}, expected {steps_before}, the step given "
                "to snapshot: a resumed run counts on from there (schedules and logs use it).")
        _check_restored(_capture(model2, optimizer2, scaler2), want, later, fresh, loaded, case)
        for i, want_loss in enumerate(want_losses):
            got_loss = _resume_step(model2, optimizer2, scaler2, data)
            if not torch.equal(got_loss, want_loss):
                raise AssertionError(
                    f"restore ({case}): step {steps_before + i} of the resumed run had loss "
                    f"{float(got_loss):.6f}, the uninterrupted run {float(want_loss):.6f}; they "
                    "must agree bit for bit. Something else that decides a step was not saved "
                    "or not restored.")
        if not _same(param_copies(model2), param_copies(model)):
            raise AssertionError(f"restore ({case}): the resumed run ended with other weights "
                                 "than the uninterrupted one.")


