"""Checkers for Lab 3, DDP from the ground up (solutions/lab3_ddp_from_scratch/...): Part 1, and
what every Lab 3 checker shares: running the learner's code on real processes, and turning what
goes wrong there (an exception on a rank, a hang, a crash) into a message that teaches.

    check_ring_all_reduce(ring_all_reduce)   Part 1  ring all-reduce from point-to-point messages

Part 2 (SimpleDDP) is in lab3_ddp.py, Part 3 (FastDDP) in lab3_buckets.py, Part 4 (train_ddp)
in lab3_train.py; what runs on the ranks, in lab3_ranks.py and lab3_record.py. Every launch has a
time limit: a ring that deadlocks fails within seconds, with where each rank was waiting, and
the ranks are always stopped. Everything runs on CPU processes with gloo, on either runner: the
lab is about the algorithms (nccl is the GPU's equivalent).
Taught in: lessons/04_distributed_fundamentals.ipynb, lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from contextlib import contextmanager

import cloudpickle
import torch

from gpulab.checks import lab3_ranks, lab3_record
from gpulab.checks.common import LIBRARY_DIR, defined_in_library
from gpulab.checks.training import _require_own_function
from gpulab.distributed.errors import LaunchTimeout, ProcessGroupStartError, RankError
from gpulab.distributed.launch import Launcher
from gpulab.self_check.stubs import STUB_HINT

RING_TIMEOUT_S = 20.0  # a ring on these sizes takes well under a second; a deadlock, forever
# What the ranks return travels through the launcher: these must be the originals.
_LAUNCH = (Launcher.run, Launcher._attempt, Launcher._supervise)

_HINTS = (  # (text in a rank's error, what to look at)
    ("view size is not compatible", "tensor.view(-1) needs a contiguous tensor. Work on "
     "flat = tensor.contiguous().view(-1), and copy the result back into the tensor at the end "
     "when the two differ (tensor.copy_(flat.view_as(tensor)))."),
    ("must be contiguous", "send and recv need contiguous tensors. The chunks of a flat 1-D "
     "view (flat.tensor_split(p)) are contiguous; rows of a transposed tensor are not."),
    ("Invalid function argument", "dist.P2POp takes dist.isend or dist.irecv itself, as in "
     "dist.P2POp(dist.isend, tensor, peer)."),
    ("same device", "Keep every tensor on the CPU here: the ranks use gloo."),
)


# ----------------------------------------------------------------------------- launching


@contextmanager
def _shipped_by_value():
    """Send what runs on the ranks by value: a rank then imports torch and not gpulab.checks,
    whose Lab 1 checkers load Numba (1.5 s per rank)."""
    for module in (lab3_ranks, lab3_record):
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in (lab3_ranks, lab3_record):
            cloudpickle.unregister_pickle_by_value(module)


def launch(fn, world_size: int, *args, name: str, case: str, timeout_s: float,
           explain_hang=None, explain_crash=None) -> list:
    """fn(rank, world_size, *args, log_dir) on `world_size` gloo ranks; the values in rank
    order. A failure becomes an AssertionError that names `name` and `case` and says what went
    wrong on which rank; explain_hang(error, logs) and explain_crash(error, logs) add what to
    look at (logs: each rank's CallLog events, see lab3_record.read_logs)."""
    if (Launcher.run, Launcher._attempt, Launcher._supervise) != _LAUNCH:
        raise AssertionError("gpulab.distributed.Launcher was changed in this notebook: "
                             "restart the kernel and run the notebook without that change.")
    log_dir = tempfile.mkdtemp(prefix="gpulab-lab3-")
    try:
        with _shipped_by_value():
            return Launcher(world_size, backend="gloo", timeout_s=timeout_s).run(
                fn, *args, log_dir)
    except RankError as error:
        logs = lab3_record.read_logs(log_dir, world_size)
        raise AssertionError(_rank_error_text(error, name, case, logs, explain_crash)) from None
    except LaunchTimeout as error:
        logs = lab3_record.read_logs(log_dir, world_size)
        hint = explain_hang(error, logs) if explain_hang else ""
        raise AssertionError(_timeout_text(error, name, case, timeout_s, hint,
                                           world_size)) from None
    except ProcessGroupStartError as error:
        raise AssertionError(
            f"{name} ({case}): the {world_size} processes could not start their process group "
            f"(twice), before any of your code ran: {str(error)[:300]}\nThis is the machine, "
            "not your code: run the cell again.") from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _rank_error_text(error: RankError, name, case, logs, explain_crash) -> str:
    where = _case_of(logs.get(error.rank, []))
    where = f" {where}" if where and where != f"in the case {case}" else ""
    extra = explain_crash(error, logs) if explain_crash else None
    if not error.exc_type:  # the process died: a signal, or os._exit
        first = str(error).splitlines()[0]
        return (f"{name} ({case}): {first}{where}.\n"
                f"{extra or 'The last lines it printed are above.'}")
    if error.exc_type == "NotImplementedError":
        return f"{name} ({case}) raised NotImplementedError on rank {error.rank}\n{STUB_HINT}"
    message = (str(error).split(": ", 1)[-1].splitlines() or [""])[0][:300]
    if "third_party/gloo" in message:  # gloo's own words name its source files, not the cause
        message = "gloo lost its connection to another rank (that rank failed, or left)"
    frames = learner_frames(error.traceback)
    text = (f"{name} ({case}) raised {error.exc_type} on rank {error.rank}{where}: {message}\n"
            + (f"Where, in your code:\n{frames}\n" if frames else ""))
    hint = extra or next((h for key, h in _HINTS if key in error.traceback), None)
    return text + (hint or ("The line above is where it failed." if frames else "Run your "
                            "function with on_ranks(...) to see the whole traceback."))


def _timeout_text(error: LaunchTimeout, name, case, timeout_s, hint, world_size) -> str:
    lines = [f"{name} ({case}) did not finish within {timeout_s:g} s, and every rank was "
             "stopped. Where each rank was:"]
    lines += [f"  rank {r}: {_shorten(error.waiting[r])}" if r in error.waiting else
              f"  rank {r}: finished (it returned)" for r in range(world_size)]
    for rank, stack in sorted(error.stacks.items()):
        mine = learner_frames(stack)
        if mine:
            lines.append(f"  rank {rank}, in your code:\n{mine}")
            break  # one rank's stack says enough; the others are above
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def _shorten(where: str) -> str:
    return re.sub(r" ?\(called at [^)]*\)", "", where).strip()


def _case_of(events: list[dict]) -> str:
    """Where a rank was, from its CallLog: "in the case <label>", or for a wrapper's step
    "during backward (a gradient hook), in the case <label>"."""
    phases = [e["phase"] for e in events if "phase" in e]
    cases = [p[len("case: "):] for p in phases if p.startswith("case: ")]
    last = phases[-1] if phases else ""
    if last in PHASE_WORDS:
        return PHASE_WORDS[last] + (f", in the case {cases[-1]}" if cases else "")
    return f"in the case {last}" if last else ""


# What a rank was doing when it failed, for a wrapper (the phases of lab3_ranks.ddp_rank).
PHASE_WORDS = {"construct": "in __init__", "forward": "in forward",
               "backward": "during backward (in a gradient hook)",
               "finish": "in finish_gradient_sync", "step": "in the optimizer's step"}

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def learner_frames(text: str, keep: int = 6) -> str:
    """From a traceback or a faulthandler stack, the lines of frames in the learner's code (not
    gpulab's, torch's or Python's), at most `keep` frames."""
    out, keeping = [], False
    for line in text.splitlines():
        match = _FRAME.match(line)
        if match:
            keeping = _is_learners(match.group(1))
            if keeping:
                out.append([line.rstrip()])
        elif keeping and line.startswith("    ") and out:
            out[-1].append(line.rstrip())
        else:
            keeping = False
    return "\n".join("\n".join(frame) for frame in out[-keep:])


def _is_learners(path: str) -> bool:
    path = path.replace("\\", "/")
    library = str(LIBRARY_DIR).replace("\\", "/")
    stdlib = f"/lib/python{sys.version_info.major}.{sys.version_info.minor}/"
    return not (path.startswith(library) or "/site-packages/" in path or stdlib in path
                or path.startswith("<"))


def require_own_class(cls, name: str) -> None:
    """AssertionError unless `cls` is a class written in the notebook: not gpulab's, not torch's
    DistributedDataParallel, and not a subclass of either."""
    if not isinstance(cls, type):
        raise AssertionError(f"{name} is not a class (it is a {type(cls).__name__}). Define it "
                             f"with `class {name}(nn.Module):` and run that cell again.")
    for base in cls.__mro__:
        module = getattr(base, "__module__", "") or ""
        if module == "gpulab" or module.startswith("gpulab."):
            raise AssertionError(f"{name} is (or extends) gpulab's {module}.{base.__name__}: "
                                 "write your own in the notebook; gpulab's earns no points.")
        if base is torch.nn.parallel.DistributedDataParallel:
            raise AssertionError(f"{name} extends torch's DistributedDataParallel: build the "
                                 "wrapper yourself from torch.distributed's collectives.")
    for attr in vars(cls).values():
        fn = getattr(attr, "__func__", attr)
        if hasattr(fn, "__code__") and defined_in_library(fn):
            raise AssertionError(f"{name}.{fn.__name__} is gpulab's {fn.__module__}."
                                 f"{fn.__name__}: write your own in the notebook.")


# ----------------------------------------------------------------------------- Part 1


def _ring_inputs(n: int, op: str, world_size: int, dtype, seed: int) -> list[torch.Tensor]:
    """One input per rank, with small integer values (every sum is exact in any order).
    For op="sum", rank r's input is m * 2**r, with m in 1..7: an element holding c * m is the
    sum of the ranks whose bits are set in c, which names what a wrong ring left out."""
    g = torch.Generator().manual_seed(seed)
    if op == "sum":
        m = torch.randint(1, 8, (n,), generator=g).to(dtype)
        return [m * 2**r for r in range(world_size)]
    return [torch.randint(-99, 100, (n,), generator=g).to(dtype) for _ in range(world_size)]


def _ring_cases(world_size, sizes, ops, transposed, dtype, seed) -> list[dict]:
    cases = []
    for i, n in enumerate(sizes):
        for op in ops:
            inputs = _ring_inputs(n, op, world_size, dtype, seed + 31 * i + len(op))
            cases.append({"label": f"n={n}, op={op!r} on {world_size} ranks", "op": op,
                          "inputs": inputs, "transposed": False, "n": n})
    if transposed:  # a (4, 5) view of a (5, 4) tensor: neither contiguous nor 1-D
        inputs = [x.reshape(5, 4) for x in _ring_inputs(20, "sum", world_size, dtype, seed + 7)]
        cases.append({"label": f"a transposed (4, 5) tensor, op='sum' on {world_size} ranks",
                      "op": "sum", "inputs": inputs, "transposed": True, "n": 20})
    return cases


def _ring_hang(error: LaunchTimeout, logs) -> str:
    waiting = " ".join(error.waiting.values())
    if "waiting in send" in waiting or "waiting in recv" in waiting:
        return ("A ring in which every rank first sends (dist.send) and only then receives "
                "deadlocks: gloo's send waits until the neighbour posts the matching receive, "
                "and the neighbour is itself stuck in its own send. Post each step's send and "
                "receive together: dist.isend and dist.irecv, then wait() on both; or "
                "dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, "
                "...)]) and wait() on each request it returns.")
    return ("A rank that waits forever is waiting for a message its neighbour never sent: every "
            "rank must make the same 2 * (p - 1) steps, and a send and its receive must both be "
            "posted or both be skipped (with n < p some chunks are empty: skip them on both "
            "sides, or send them on both).")


def _ring_crash(error: RankError, logs) -> str | None:
    if error.exc_type or "SIGABRT" not in str(error):
        return None
    return ("gloo aborts a process that receives a message larger than the buffer it posted: "
            "the chunk a rank sends at a step must be the very chunk its right neighbour "
            "receives at that step (when n is not a multiple of p the chunks differ in size). "
            "Check each step's chunk indices.")


def check_ring_all_reduce(ring_all_reduce, world_sizes=(2, 3), sizes=(7, 1000),
                          ops=("sum", "max"), transposed: bool = False, dtype=torch.float32,
                          seed: int = 0) -> None:
    """ring_all_reduce(tensor, op) on real processes equals dist.all_reduce: for each world size,
    each size and each op ("sum", "max"); in place; from point-to-point messages only."""
    _require_own_function(ring_all_reduce, "ring_all_reduce")
    for p in world_sizes:
        cases = _ring_cases(p, sizes, ops, transposed, dtype, seed + p)
        results = launch(lab3_ranks.ring_rank, p, ring_all_reduce, cases,
                         name="ring_all_reduce", case=f"{p} ranks", timeout_s=RING_TIMEOUT_S,
                         explain_hang=_ring_hang, explain_crash=_ring_crash)
        for i, case in enumerate(cases):
            _grade_ring_case(case, [results[r][i] for r in range(p)], p)


def _grade_ring_case(case: dict, per_rank: list[dict], p: int) -> None:
    label = case["label"]
    for r, res in enumerate(per_rank):
        collectives = sorted({c for c in res["calls"] if c in lab3_record.COLLECTIVES
                              and c != "barrier"})
        if collectives:
            raise AssertionError(
                f"ring_all_reduce ({label}) called dist.{', dist.'.join(collectives)} on rank "
                f"{r}: build the ring from point-to-point messages only (dist.isend and "
                "dist.irecv, dist.batch_isend_irecv, or dist.send and dist.recv). A collective "
                "inside it is the very thing you are building; it earns no points.")
        if res["borrowed"]:
            raise AssertionError(
                f"ring_all_reduce ({label}) ran {res['borrowed'][0]} on rank {r}: write the "
                "ring yourself, in the notebook; gpulab's version (lesson 04) earns no points.")
    inputs = [x.t() if case["transposed"] else x for x in case["inputs"]]
    stacked = torch.stack(inputs)
    want = stacked.sum(0) if case["op"] == "sum" else stacked.amax(0)
    for r, res in enumerate(per_rank):
        if not torch.equal(res["reference"], want):  # gloo itself: never expected to differ
            raise AssertionError(f"dist.all_reduce ({label}) gave a wrong answer on rank {r}: "
                                 "the machine's gloo is broken; report this.")
        got = res["got"]
        if torch.equal(got, want):
            continue
        raise AssertionError(f"ring_all_reduce ({label}): {_ring_mistake(case, inputs, res, r, p)}")


def _ring_mistake(case, inputs, res, r: int, p: int) -> str:
    """What is wrong with rank r's result, in words."""
    op, got = case["op"], res["got"]
    stacked = torch.stack(inputs)
    total, peak = stacked.sum(0), stacked.amax(0)
    want = total if op == "sum" else peak
    returned = res["returned"]
    layout = ""
    if case["transposed"]:
        layout = (" This tensor is a transposed view, not contiguous: tensor.reshape(-1) and "
                  "tensor.flatten() copy it, so the sum lands in the copy. Work on flat = "
                  "tensor.contiguous().view(-1), and end with tensor.copy_(flat.view_as(tensor)) "
                  "when flat is a copy.")
    if torch.equal(got, inputs[r]):
        if isinstance(returned, torch.Tensor) and torch.equal(returned, want):
            return (f"it returned the right result, but the tensor passed in still holds rank "
                    f"{r}'s own values: write the result into `tensor` itself (in place), as "
                    f"dist.all_reduce does.{layout}")
        return (f"the tensor passed in is unchanged on rank {r}: ring_all_reduce must leave "
                f"the result in it (in place).{layout}")
    if op == "sum" and torch.allclose(got * p, total):
        return (f"rank {r} holds the mean over the {p} ranks, not the sum. An all-reduce sums, "
                "as dist.all_reduce does by default (ReduceOp.SUM); data parallelism divides by "
                "the world size itself, later (Part 2).")
    if op == "max" and torch.equal(got, total):
        return (f"rank {r} holds the sum; for op='max', combine what arrives with your chunk by "
                "torch.maximum (elementwise), where op='sum' adds.")
    flat_got, chunks = got.reshape(-1), torch.arange(got.numel()).tensor_split(p)
    flat_want = want.reshape(-1)
    right = [k for k, idx in enumerate(chunks) if torch.equal(flat_got[idx], flat_want[idx])]
    bad = int(torch.nonzero(flat_got != flat_want)[0])
    k = next(k for k, idx in enumerate(chunks) if bad in idx.tolist())
    first, last = int(chunks[k][0]), int(chunks[k][-1])
    value, expected = flat_got[bad].item(), flat_want[bad].item()
    what = (f"element {bad} (in chunk {k}, elements {first}..{last}) is {value:g}, expected "
            f"{expected:g}")
    if op == "sum":
        c = value / inputs[0].reshape(-1)[bad].item()  # rank s contributes 2**s times m
        if c == int(c) and 0 < c < 2**p:
            ranks = [str(s) for s in range(p) if int(c) >> s & 1]
            what += (f": rank {ranks[0]}'s value alone" if len(ranks) == 1 else
                     f": the sum of ranks {', '.join(ranks)} only")
        elif c == int(c) and c >= 2**p:
            what += ": some rank's value was added more than once"
    if len(right) == 1:
        return (f"on rank {r}, {what}. Only chunk {right[0]} is complete: the reduce-scatter "
                "works, and the all-gather is missing or wrong. In p - 1 more steps each rank "
                "passes the finished chunks on around the ring, copying what arrives over its "
                "own chunk (not adding it): at step s rank r sends chunk (r + 1 - s) % p and "
                "receives chunk (r - s) % p.")
    return (f"on rank {r}, {what}. Check which chunk each step sends and receives: at step "
            "s = 0 .. p - 2 of the reduce-scatter, rank r sends chunk (r - s) % p to rank "
            "(r + 1) % p and combines the chunk it receives, (r - s - 1) % p, from rank "
            "(r - 1) % p into its own; after it, rank r holds the finished chunk (r + 1) % p.")
