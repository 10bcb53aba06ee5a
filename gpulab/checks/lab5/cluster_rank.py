"""What every rank of Lab 5's cluster check runs, at the end of the script that the checker writes
(pp_tp_cluster.py): join the process group, make the (dp=1, pp, tp) groups, and for
each case build the GPT from the checker's weights, call the learner's pp_tp_step on it, and save
what came back as plain tensors for the checker to grade.

    main(globals(), work_dir, {"pp_tp_step": "pp_tp_step", "TPMLP": "TPMLP", ...})

work_dir/cases.pt     written by the checker: grid sizes, GPT config and weights, the cases
work_dir/rank{N}.pt   written here: this rank's node and coordinates; per case, its stage's
                      parameters and their gradients by name, the loss, the actions its stage
                      ran, and how many times one_f_one_b_stage was called

The script loads this file by its path, not as gpulab.checks.lab5.cluster_rank: importing the
package would load every lab's checkers (Numba among them) on every rank.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gpulab.distributed.groups import RankGrid, new_groups
from gpulab.models import GPT, GPTConfig


class ReturnError(TypeError):
    """pp_tp_step returned something the checker cannot grade; the message says what to return."""


class _Counted:
    """A function that counts its calls (one_f_one_b_stage, as pp_tp_step finds it)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def main(namespace: dict, work_dir: str, graded: dict[str, str]) -> None:
    torch.set_num_threads(1)  # the checker's reference runs on one thread too
    work = Path(work_dir)
    spec = torch.load(work / "cases.pt", weights_only=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = new_groups(RankGrid(1, spec["pp_size"], spec["tp_size"]))
    step, tp_mlp = namespace[graded["pp_tp_step"]], namespace[graded["TPMLP"]]
    order_fn = namespace[graded["one_f_one_b_stage"]]
    counted = _Counted(order_fn)
    for key, value in list(namespace.items()):  # every name pp_tp_step may call it by
        if value is order_fn:
            namespace[key] = counted
    cases = []
    for case in spec["cases"]:
        gpt = GPT(GPTConfig(**spec["config"]))
        gpt.load_state_dict(spec["state_dict"])
        counted.calls = 0
        torch.manual_seed(case["seed"])
        returned = step(gpt, case["x"].clone(), case["y"].clone(), groups,
                        case["n_microbatches"])
        cases.append(_record(returned, tp_mlp, counted.calls))
    torch.save({"rank": rank, "node": int(os.environ.get("GROUP_RANK", -1)),
                "coords": tuple(groups.coords), "cases": cases}, work / f"rank{rank}.pt")
    dist.barrier()  # nobody leaves while another rank may still need a connection
    dist.destroy_process_group()


def _record(returned, tp_mlp: type, order_calls: int) -> dict:
    """What the checker grades, as tensors, numbers and strings only."""
    if not (isinstance(returned, tuple | list) and len(returned) == 2):
        raise ReturnError(f"pp_tp_step returned {type(returned).__name__} {_short(returned)}; "
                          "return a pair (module, result): this rank's stage module and what "
                          "run_pipeline returned.")
    module, result = returned
    if not isinstance(module, nn.Module):
        raise ReturnError(f"the first item pp_tp_step returned is a {type(module).__name__}; "
                          "it must be this rank's stage module (the GPTStage from split_gpt, "
                          "with its MLPs replaced), after backward.")
    if not all(hasattr(result, a) for a in ("losses", "timings", "peak_held")):
        raise ReturnError(f"the second item pp_tp_step returned is a {type(result).__name__}; "
                          "it must be what run_pipeline returned (a PipelineResult).")
    blocks = getattr(module, "blocks", None)
    blocks = dict(blocks.items()) if isinstance(blocks, nn.ModuleDict) else {}
    return {
        "values": {n: p.detach().clone() for n, p in module.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.detach().clone()
                  for n, p in module.named_parameters()},
        "ff_types": {key: (type(getattr(b, "ff", None)).__name__,
                           isinstance(getattr(b, "ff", None), tp_mlp))
                     for key, b in blocks.items()},
        "losses": [float(v) for v in result.losses],
        "actions": [(str(t.kind), int(t.microbatch)) for t in result.timings],
        "peak_held": int(result.peak_held),
        "order_calls": order_calls,
    }


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."
