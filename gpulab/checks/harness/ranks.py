"""Running the learner's code on real processes for a checker, and turning what goes wrong there
(an exception on a rank, a hang, a crash) into a message that teaches.

    launch(rank_fn, world_size, *args, name="ring_all_reduce", case="p=2, n=7",
           timeout_s=20, ship=(lab3_ranks,), explain_hang=..., explain_crash=...)
    learner_frames(traceback_text)          the frames of the learner's code, not the library's

Every launch has a time limit: a ring that deadlocks fails within seconds, with where each rank
was waiting, and the ranks are always stopped. Everything runs on CPU processes with gloo, on
either runner: the labs that use it are about the algorithms (nccl is the GPU's equivalent).
What the ranks ask of torch.distributed is recorded by calls.py.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from contextlib import contextmanager

import cloudpickle

from gpulab.checks.harness import calls
from gpulab.checks.harness.whose import is_learners
from gpulab.distributed.runtime.errors import LaunchTimeout, ProcessGroupStartError, RankError
from gpulab.distributed.runtime.launch import Launcher
from gpulab.stubs import STUB_HINT

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
def _shipped_by_value(modules):
    """Send what runs on the ranks by value (the lab's rank module and the call recorder): a
    rank then imports torch, not the checkers around them."""
    for module in (calls, *modules):
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in (calls, *modules):
            cloudpickle.unregister_pickle_by_value(module)


def launch(fn, world_size: int, *args, name: str, case: str, timeout_s: float, ship=(),
           explain_hang=None, explain_crash=None, backend: str = "gloo") -> list:
    """fn(rank, world_size, *args, log_dir) on `world_size` gloo ranks (nccl: one GPU each, for
    a check that runs the learner's code on GPUs too), with the modules in
    `ship` (what runs there) sent by value; the values in rank order. A failure becomes an
    AssertionError that names `name` and `case` and says what went
    wrong on which rank; explain_hang(error, logs) and explain_crash(error, logs) add what to
    look at (logs: each rank's CallLog events, see calls.read_logs)."""
    if (Launcher.run, Launcher._attempt, Launcher._supervise) != _LAUNCH:
        raise AssertionError("gpulab.distributed.Launcher was changed in this notebook: "
                             "restart the kernel and run the notebook without that change.")
    log_dir = tempfile.mkdtemp(prefix="gpulab-lab3-")
    try:
        with _shipped_by_value(ship):
            return Launcher(world_size, backend=backend, timeout_s=timeout_s).run(
                fn, *args, log_dir)
    except RankError as error:
        logs = calls.read_logs(log_dir, world_size)
        raise AssertionError(_rank_error_text(error, name, case, logs, explain_crash)) from None
    except LaunchTimeout as error:
        logs = calls.read_logs(log_dir, world_size)
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
    if error.exc_type == "NotImplementedError" and not extra:  # a stub, not torch's refusal
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


# What a rank was doing when it failed, for a wrapper (the phases of lab3's ddp_rank).
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
            keeping = is_learners(match.group(1))
            if keeping:
                out.append([line.rstrip()])
        elif keeping and line.startswith("    ") and out:
            out[-1].append(line.rstrip())
        else:
            keeping = False
    return "\n".join("\n".join(frame) for frame in out[-keep:])
