"""Lab 2, Part 1: moving a batch to the device, asynchronously (check_to_device).
Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""



from __future__ import annotations

import torch

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.training import (
    StepWatch,
    call_learner,
    one_thread,
)


def _describe_mismatch(got, given, path: str, device: torch.device) -> str | None:
    """What is wrong with `got` as `given` moved to `device`, or None."""
    if isinstance(given, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path} came back as a {type(got).__name__}, expected a tensor on {device}."
        if got.device != device:
            deep = "" if path == "batch" else (" Recurse: a tensor inside a dict, list or "
                                               "tuple must move too, at any depth.")
            return f"{path} is on {got.device}, expected {device}.{deep}"
        if got.dtype != given.dtype or got.shape != given.shape:
            return (f"{path} is {got.dtype} {tuple(got.shape)}, expected {given.dtype} "
                    f"{tuple(given.shape)}: move it, do not convert it (.to(device) only).")
        return None
    if isinstance(given, dict | list | tuple):
        if type(got) is not type(given):
            return (f"{path} is a {type(got).__name__}, expected a {type(given).__name__}: "
                    "keep each container's type, so that code which unpacks or indexes the "
                    "batch works on either device.")
        if isinstance(given, dict):
            if list(got) != list(given):
                return f"{path} has keys {list(got)}, expected {list(given)}."
            pairs = [(got[k], given[k], f"{path}[{k!r}]") for k in given]
        else:
            if len(got) != len(given):
                return f"{path} has {len(got)} items, expected {len(given)}."
            pairs = [(got[i], v, f"{path}[{i}]") for i, v in enumerate(given)]
        for g, v, where in pairs:
            found = _describe_mismatch(g, v, where, device)
            if found:
                return found
        return None
    if got is not given and (isinstance(got, torch.Tensor) or got != given):
        return (f"{path} was {given!r} and came back as {got!r}: leave what is not a tensor "
                "as it is.")
    return None


def _count_tensors(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return 1
    if isinstance(tree, dict):
        return sum(_count_tensors(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_count_tensors(v) for v in tree)
    return 0


def _to_device_cases(nested: bool) -> list:
    g = torch.Generator().manual_seed(7 if nested else 0)
    x = torch.randn(4, 3, generator=g)  # (B, F)
    y = torch.randint(0, 5, (4,), generator=g)  # (B,)
    mask = torch.rand(4, generator=g) > 0.5  # (B,) bool
    if not nested:
        return [(x, y), {"x": x, "y": y, "mask": mask}]
    return [x, [], [(x, y), (x, y)],
            {"inputs": (x, [y, mask]), "info": {"ids": y, "name": "batch-7", "n": 3,
                                                "none": None}}]


@one_thread()
def check_to_device(to_device, nested: bool = False) -> None:
    """to_device(batch, device): every tensor of a batch (a tensor, or tuples, lists and dicts
    of them, nested) copied to `device` with non_blocking=True; containers keep their type and
    anything else comes back as it was. Graded on the `meta` device."""
    require_own_function(to_device, "to_device")
    device = torch.device("meta")
    for batch in _to_device_cases(nested):
        case = f"a {type(batch).__name__} batch to {device}"
        with StepWatch() as watch:
            got = call_learner(to_device, "to_device", batch, device, case=case)
        wrong = _describe_mismatch(got, batch, "batch", device)
        if wrong:
            raise AssertionError(f"to_device ({case}): {wrong}")
        slow = watch.copies.count(False)
        if slow:
            raise AssertionError(
                f"to_device ({case}): {slow} of {_count_tensors(batch)} tensor copies were not "
                "asynchronous: call .to(device, non_blocking=True). From pinned (page-locked) "
                "memory a copy to a CUDA GPU then runs while the GPU computes; without it the "
                "host waits for every copy.")


