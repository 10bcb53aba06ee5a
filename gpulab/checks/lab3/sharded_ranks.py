"""What Part 5's checker runs on each rank: the learner's sharded optimizer, between recorders.

    sharded_rank   a few AdamW steps through optimizer_class(model.parameters(), **kwargs), each
                   after a backward on this rank's share of the batch; returns the parameters
                   after each step, this rank's gradients, what step() asked of
                   torch.distributed, and the bytes the optimizer keeps between steps
    kept_tensors   those bytes: every tensor reachable from the optimizer object, parameters
                   and gradients (and views of them) left out

Shipped to the ranks by value, with ranks.py: nothing here may import gpulab.checks but those
two and the call recorder, which travel with it.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from gpulab.checks.harness.calls import CallLog, log_path
from gpulab.checks.lab3.ranks import build_model  # shipped by value too

# Code whose objects a learner's optimizer may not hold: it would be borrowing the answer.
BORROWED_MODULES = (("torch.distributed.optim", "torch's ZeroRedundancyOptimizer"),
                    ("gpulab.", "gpulab's own ZeroOneOptimizer"))
MAX_OBJECTS = 10_000  # a walk through the optimizer's attributes stops here


def sharded_rank(rank, world_size, optimizer_class, case, log_dir):
    """case: plain data (cases.make_case): the model, its batches, the optimizer's kwargs. The
    model is built from one seed on every rank: the replicas start equal, as after DDP's
    broadcast. Returns the parameters after each step, this rank's gradients before each step,
    the calls of each step, and what the optimizer keeps after the last step."""
    model = build_model(case["model"], case["seed"])
    params = list(model.parameters())
    log = CallLog(log_path(log_dir, rank))
    with log.recording():
        log.set_phase("construct")
        optimizer = optimizer_class(model.parameters(), **case["kwargs"])
    grads, after = [], []
    for step, (x, y) in enumerate(case["batches"]):
        shard = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[shard]), y[shard]).backward()
        grads.append([p.grad.detach().clone() for p in params])
        with log.recording():
            log.set_phase("step", step)
            optimizer.step()
        after.append([p.detach().clone() for p in params])
    kept, borrowed = kept_tensors(optimizer, params)
    return {"params": after, "grads": grads, "borrowed": list(log.borrowed) + borrowed,
            "calls": [c for c in log.calls if c["phase"] == "step"], "sent": len(log.sent),
            "kept": kept}


def kept_tensors(optimizer, params) -> tuple[list[dict], list[str]]:
    """Every storage the optimizer object holds a tensor of (through its attributes, lists,
    dicts and any torch optimizer inside it), once each: [{"where", "bytes", "numel"}], largest
    first. The parameters' and the gradients' storages are not the optimizer's: views of them
    are left out. Also the borrowed classes met on the way."""
    mine = {t.untyped_storage().data_ptr() for p in params
            for t in (p, p.grad) if t is not None}
    seen, found, borrowed = set(), {}, []
    stack = [(optimizer, type(optimizer).__name__, 0)]
    while stack and len(seen) < MAX_OBJECTS:
        obj, where, depth = stack.pop()
        if id(obj) in seen or depth > 12:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if obj.device.type != "meta" and storage.data_ptr() not in mine:
                found.setdefault(storage.data_ptr(), {"where": where, "bytes": storage.nbytes(),
                                                      "numel": obj.numel()})
            continue
        module = getattr(type(obj), "__module__", "") or ""
        for prefix, whose in BORROWED_MODULES:
            if module.startswith(prefix) and whose not in borrowed:
                borrowed.append(whose)
        if isinstance(obj, dict):
            children = [(v, f"{where}[{_short(k)}]") for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            children = [(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        elif isinstance(obj, torch.nn.Module | type | types.FunctionType | types.MethodType
                        | types.BuiltinFunctionType | types.ModuleType):
            continue  # the model (its parameters are not the optimizer's), classes, functions
        else:
            fields = getattr(obj, "__dict__", None) or {}
            slots = [s for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
            children = [(v, f"{where}.{k}") for k, v in fields.items()]
            children += [(getattr(obj, s), f"{where}.{s}") for s in slots]
        stack.extend((child, name, depth + 1) for child, name in children)
    kept = sorted(found.values(), key=lambda t: -t["bytes"])
    return kept, borrowed


def _short(key) -> str:
    if isinstance(key, torch.Tensor):
        return f"<a tensor of shape {tuple(key.shape)}>"
    return repr(key) if isinstance(key, str | int) else type(key).__name__
