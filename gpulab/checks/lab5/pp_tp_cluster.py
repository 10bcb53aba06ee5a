"""Checker for Lab 5, Part 4 (solutions/lab5_parallelism_across_nodes/...): a small GPT split
over pp_size = nodes pipeline stages, each Block's MLP split over tp_size = procs_per_node
ranks, trained one step with 1F1B on a LocalCluster, against the same GPT in one process.

    check_pp_tp_cluster(pp_tp_step, TPMLP, CopyToTP, ReduceFromTP, ColumnParallelLinear,
                        RowParallelLinear, one_f_one_b_stage, n_microbatches=4)

What happens: the learner's code is written out as a script (gpulab.distributed.runtime.node_script:
their sources and what those use from the notebook), every node of a LocalCluster(nodes,
procs_per_node) runs it under torchrun, and on each rank the end of the script (cluster_rank.py)
calls pp_tp_step once per case and saves the stage's parameters and gradients. Here, the same
GPT runs forward and backward on the whole batch in one process, and each rank's loss and
gradients are compared with it: replicated parameters whole, the MLPs' shards with the slice of
the full gradient that their values identify (fc: a block of rows, proj: a block of columns,
proj's bias whole). Several n_microbatches cost one launch (10-20 s on 2 busy cores).

The grid is RankGrid(dp_size=1, pp_size=nodes, tp_size=procs_per_node): torchrun numbers a
node's ranks contiguously and the grid varies tp fastest, so each TP group is one node and
each pipeline crosses the nodes, the layout lesson 06 derives. The weights are drawn larger
than GPT's own initialisation (std 0.02) so that the logits are of order one: a bias added
tp_size times or a missing all-reduce then moves the loss far beyond fp32 round-off.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from gpulab.checks.harness.owned import require_own_class, require_own_function
from gpulab.checks.harness.ranks import learner_frames
from gpulab.checks.harness.training import one_thread
from gpulab.checks.lab5 import cluster_grade as lab5_cluster_grade
from gpulab.checks.lab5 import cluster_rank as lab5_cluster_rank
from gpulab.distributed.groups import RankGrid
from gpulab.distributed.runtime.cluster import LocalCluster
from gpulab.distributed.runtime.cluster_result import START_FAILURE
from gpulab.distributed.runtime.errors import LaunchTimeout, ProcessGroupStartError
from gpulab.distributed.runtime.node_script import SourceNotFound, script_of
from gpulab.models import GPT, GPTConfig

RUN_TIMEOUT_S = 30.0  # one step of this GPT takes about a second; a hang, forever
SCRIPT_NAME = "pp_tp_train.py"
BATCH, SEQ, N_EMBD, VOCAB = 8, 8, 16, 32  # (B, T), C and the vocabulary: a tiny GPT
CLASSES = ("TPMLP", "CopyToTP", "ReduceFromTP", "ColumnParallelLinear", "RowParallelLinear")

PRELUDE = '''"""What every node of the cluster runs: your Lab 5 code, copied from the notebook, then
one training step per case (gpulab/checks/lab5/cluster_rank.py). Written by the checker."""
import gpulab  # first: it decides the runner

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpulab.distributed import PipelineStage, RankGrid, new_groups, run_pipeline, split_gpt
from gpulab.train import cross_entropy
'''

MAIN = '''if __name__ == "__main__":
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("lab5_cluster_rank", {rank_file!r})
    rank_code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rank_code)
    rank_code.main(globals(), sys.argv[1], {graded!r})
'''


def make_gpt(seed: int, pp_size: int) -> GPT:
    """A GPT of 2 Blocks per stage with every weight drawn from `seed` (see the module doc);
    torch's global random state is left as it was."""
    config = GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=2 * pp_size, n_head=2,
                       n_embd=N_EMBD, dropout=0.0)
    with torch.random.fork_rng(devices=[]):
        gpt = GPT(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 2:  # (out, in) weights and (n, C) embeddings
                p.copy_(noise / math.sqrt(p.shape[1]))
            elif name.endswith("weight"):  # layer norms' scales
                p.copy_(1 + 0.2 * noise)
            else:  # every bias non-zero: a bias counted twice must show
                p.copy_(0.2 * noise)
    return gpt


def _cases(n_microbatches, seed: int) -> list[dict]:
    ms = [n_microbatches] if isinstance(n_microbatches, int) else list(n_microbatches)
    if not ms or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in ms):
        raise ValueError(f"n_microbatches must be an int >= 1 or a list of them, got "
                         f"{n_microbatches!r}")
    cases = []
    for k, m in enumerate(ms):
        batch = m * max(1, BATCH // m)  # equal microbatches of at least one sequence
        g = torch.Generator().manual_seed(1000 * seed + 17 * k + m)
        x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)  # (B, T) token ids
        y = torch.randint(0, VOCAB, (batch, SEQ), generator=g)  # (B, T) next tokens
        cases.append({"n_microbatches": m, "x": x, "y": y, "seed": seed + k})
    return cases


def _script(graded: dict) -> str:
    try:
        return script_of(graded, PRELUDE, MAIN.format(
            rank_file=str(Path(lab5_cluster_rank.__file__).resolve()),
            graded={role: obj.__name__ for role, obj in graded.items()}))
    except SourceNotFound as error:
        raise AssertionError(f"check_pp_tp_cluster: {error}") from None


def check_pp_tp_cluster(pp_tp_step, TPMLP, CopyToTP, ReduceFromTP,  # noqa: N803 - their names
                        ColumnParallelLinear, RowParallelLinear, one_f_one_b_stage,
                        nodes: int = 2, procs_per_node: int = 2,
                        n_microbatches: int | Sequence[int] = 4, seed: int = 0,
                        isolation: str = "auto", timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Run pp_tp_step(gpt, x, y, groups, n_microbatches) on every rank of a 2-node local cluster
    (nodes x procs_per_node ranks; pp_size = nodes, tp_size = procs_per_node) and compare each
    rank's loss and gradients with the whole GPT's in one process, for each n_microbatches."""
    require_own_function(pp_tp_step, "pp_tp_step")
    require_own_function(one_f_one_b_stage, "one_f_one_b_stage")
    classes = (TPMLP, CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear)
    for name, cls in zip(CLASSES, classes, strict=True):
        require_own_class(cls, name)
    grid = RankGrid(1, nodes, procs_per_node)
    if (4 * N_EMBD) % procs_per_node:
        raise ValueError(f"procs_per_node={procs_per_node} must divide the MLP's "
                         f"{4 * N_EMBD} hidden units")
    graded = {"pp_tp_step": pp_tp_step, "one_f_one_b_stage": one_f_one_b_stage,
              **dict(zip(CLASSES, classes, strict=True))}
    script = _script(graded)
    gpt, cases = make_gpt(seed, nodes), _cases(n_microbatches, seed)
    work = Path(tempfile.mkdtemp(prefix="gpulab-lab5-"))
    try:
        (work / SCRIPT_NAME).write_text(script)
        torch.save({"pp_size": nodes, "tp_size": procs_per_node, "config": vars(gpt.config),
                    "state_dict": gpt.state_dict(), "cases": cases}, work / "cases.pt")
        cluster, result = _launch(work, grid, script, isolation, timeout_s)
        records = _read(work, grid)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(_layout(cluster, records, grid))
    with one_thread():  # the ranks' one thread each: sums in a comparable order
        for k, case in enumerate(cases):
            reference = lab5_cluster_grade.reference(gpt, case["x"], case["y"])
            per_rank = [records[r]["cases"][k] for r in range(grid.world_size)]
            print(lab5_cluster_grade.grade_case(per_rank, reference, gpt, grid, case,
                                                TPMLP.__name__))


def _launch(work: Path, grid: RankGrid, script: str, isolation: str, timeout_s: float):
    try:
        with LocalCluster(grid.pp_size, grid.tp_size, isolation, echo=False) as cluster:
            result = cluster.run(work / SCRIPT_NAME, [str(work)], timeout_s=timeout_s)
    except LaunchTimeout as error:
        raise AssertionError(_hang_text(error, script, grid, timeout_s,
                                                             SCRIPT_NAME)) from None
    except ProcessGroupStartError as error:
        raise AssertionError(_machine_text(str(error))) from None
    if not result.ok:
        if result.error.startswith(START_FAILURE):
            raise AssertionError(_machine_text(result.error))
        raise AssertionError(_rank_failure_text(result, work, grid))
    return cluster, result


def _machine_text(error: str) -> str:
    return ("check_pp_tp_cluster: the cluster could not start its ranks (twice), before any of "
            f"your code ran: {error.splitlines()[0][:300] if error else ''}\nThis is the "
            "machine, not your code: run the cell again.")


def _rank_failure_text(result, work: Path, grid: RankGrid) -> str:
    rank, text = result.failed_rank, result.error.replace(f"{work}/", "")
    where = ""
    if rank is not None and 0 <= rank < grid.world_size:
        _, pp_rank, tp_rank = grid.coords(rank)
        where = f" (pipeline stage {pp_rank}, tp rank {tp_rank})"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {result.returncode}"
    exc_type = last.split(":", 1)[0].rsplit(".", 1)[-1] if ":" in last else ""
    message = last.split(": ", 1)[1] if exc_type and ": " in last else last
    if exc_type == "ReturnError":
        return f"pp_tp_step on rank {rank}{where}: {message}"
    frames = learner_frames(_without_main(text))
    stub = last.split(":", 1)[0].rsplit(".", 1)[-1].strip() == "NotImplementedError"
    verb = "raised NotImplementedError" if stub else "failed"
    out = [f"pp_tp_step {verb} on rank {rank}{where} of the cluster: {last[:400]}"]
    if frames:
        out.append(f"Where, in {SCRIPT_NAME} (your code, as every node runs it):\n{frames}")
    out.append(_failure_hint(exc_type, text))
    return "\n".join(out)


def _without_main(traceback_text: str) -> str:
    """A traceback without the script's own frame (`<module>`: the call into the rank code)."""
    out, skipping = [], False
    for line in traceback_text.splitlines():
        if line.startswith("  File "):
            skipping = line.endswith("in <module>")
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


def _read(work: Path, grid: RankGrid) -> list[dict]:
    records = []
    for rank in range(grid.world_size):
        path = work / f"rank{rank}.pt"
        if not path.exists():
            raise AssertionError(f"rank {rank} ended without saving its results: did your code "
                                 "end the process (sys.exit, os._exit) or destroy the process "
                                 "group? Leave both to the script.")
        records.append(torch.load(path, weights_only=True))
    return records


def _layout(cluster: LocalCluster, records: list[dict], grid: RankGrid) -> str:
    nodes: dict[int, list[int]] = {}
    for record in records:
        nodes.setdefault(record["node"], []).append(record["rank"])
    where = "; ".join(f"node {n} holds ranks {', '.join(map(str, ranks))}"
                      for n, ranks in sorted(nodes.items()))
    addresses = ", ".join(cluster.addresses)
    tp = " ".join(map(str, grid.groups("tp")))
    pp = " ".join(map(str, grid.groups("pp")))
    return (f"{grid.pp_size} nodes x {grid.tp_size} processes, isolation {cluster.isolation} "
            f"(node addresses {addresses}): {where}\n"
            f"RankGrid(dp_size=1, pp_size={grid.pp_size}, tp_size={grid.tp_size}): "
            f"tp groups {tp}; pipelines {pp}")


# ----------------------------------------------------------------------------- hangs, failures

_CALLED_AT = re.compile(r"\(called at ([^):]+):(\d+)\)")


def _with_line(text: str, script_lines: list[str], script_name: str) -> str:
    def show(match):
        path, line = match.group(1), int(match.group(2))
        if not path.endswith(script_name):  # gpulab's own file: from gpulab/ on
            short = path[path.rfind("gpulab/"):] if "gpulab/" in path else path
            return f"(called at {short}:{line})"
        code = script_lines[line - 1].strip() if 0 < line <= len(script_lines) else ""
        return f"(called at {script_name}:{line}: `{code}`)"

    return _CALLED_AT.sub(show, text)


def _hang_text(error, script: str, grid: RankGrid, timeout_s: float, script_name: str) -> str:
    lines = script.splitlines()
    out = [f"pp_tp_step did not finish within {timeout_s:g} s on the cluster, and every rank "
           "was stopped. Where each rank was:"]
    waiting = {r: _with_line(w, lines, script_name) for r, w in error.waiting.items()}
    for rank in range(grid.world_size):
        doing = waiting.get(rank, "finished or not started")
        out.append(f"  {lab5_cluster_grade.where(grid, rank)}: {doing}")
    in_all_reduce = [r for r, w in waiting.items() if "all_reduce" in w]
    if in_all_reduce and len(in_all_reduce) < grid.world_size:
        out.append("Some ranks wait in an all-reduce that the others never join. An all-reduce "
                   "without group= runs over all the ranks, the other stage's too, which are "
                   "busy elsewhere in the pipeline: pass the TP group, the `group` your classes "
                   "were given (groups.tp).")
    else:
        out.append("Every rank of a group must make the same collective calls in the same "
                   "order: look for one that only some ranks make, or a receive whose send "
                   "never comes.")
    return "\n".join(out)


HINTS = (  # (text in the traceback, what to look at)
    ("NotImplementedError", "Replace `raise NotImplementedError()` with your code."),
    ("NameError", "The script every node runs holds your code's text, with the functions, "
     "classes, modules and constants it names from the notebook, but no other data: build "
     "what pp_tp_step needs inside it, or import it there."),
    ("ScheduleError", "run_pipeline checks the order before running it: fix one_f_one_b_stage "
     "(Part 3's check says how), and pass one list per stage, for every stage."),
    ("but was told it is stage", "A PipelineStage is told its place in the pipeline: stage "
     "groups.coords.pp_rank of grid.pp_size, with group=groups.pp."),
    ("needs the order's", "Give run_pipeline n_microbatches inputs on the first stage: "
     "list(x.chunk(n_microbatches)), and the targets likewise: list(y.chunk(n_microbatches))."),
    ("shapes cannot be multiplied", "ColumnParallelLinear's output, (B, T, 4C/tp_size), is "
     "RowParallelLinear's input; each layer keeps its block of the full nn.Linear's weight."),
)


def _failure_hint(exc_type: str, text: str) -> str:
    return next((hint for key, hint in HINTS if key in text or key == exc_type),
                "The lines above, from the script, show where it failed.")
