"""Pipeline parallelism for real: one process per stage, running schedule.py's per-stage orders
with its own point-to-point sends.

    stages = split_gpt(gpt, pp_size)                        # pipeline_split.py
    stage = PipelineStage(stages[pp_rank], pp_rank, pp_size, group=groups.pp)
    order = one_f_one_b_order(pp_size, m)                   # or gpipe_order, or your own
    result = run_pipeline(stage, order, list(x.chunk(m)), list(y.chunk(m)), cross_entropy)
    result.loss           # on the last stage: the whole batch's mean loss (None elsewhere)
    result.peak_held      # microbatches held at once: m with GPipe, min(p - s, m) with 1F1B
    measured_schedule(results)   # every stage's timings as a Schedule: bubble_fraction, text()

What one stage does for each action of its list (run_pipeline):
  ("F", i)  receive microbatch i's activation from the previous stage (the first stage takes
            microbatches[i]), make it require grad, run the module, keep input and output until
            the backward, send the output on. The last stage turns its output into
            loss_fn(output, targets[i]) / m and keeps that: the 1/m makes the gradients summed
            over the m microbatches those of the whole batch's mean loss.
  ("B", i)  receive the gradient of microbatch i's output from the next stage (the last stage
            starts from its loss), torch.autograd.backward(output, grad), send the input's
            .grad to the previous stage, and drop both tensors: those activations are freed.
Gradients accumulate in the stage's parameters (zero them between steps, as usual).

Why non-blocking sends. On gloo a send completes only once the peer has posted the matching
receive, so a blocking dist.send waits for the peer. In 1F1B's steady state stage s runs F(j)
then B(i) while stage s + 1 runs B(i) then F(j): s sends activation j and s + 1 sends gradient
i at the same moment, each blocked until the other receives, and neither reaches its receive:
a deadlock (blocking_sends=True shows it). So every send here is an isend, posted together
with the receive of the stage's next action in one batch_isend_irecv (Megatron-LM's
send_forward_recv_backward pairing); a stage then waits only for what it receives, and a send
completes whenever its peer gets there. On gloo any order that check_schedule accepts runs.

Shapes: the first activation a stage sends in a run is preceded by a small header (dtype and
shape); every later one must have that shape, and gradients have their activation's shape.
Tags carry the microbatch, so on gloo a stage may receive microbatches in another order than
its neighbour sent them. NCCL ignores tags and matches each pair's messages in order:
run_pipeline then requires each pair of neighbours to send and receive in the same order (true
of gpipe_order and one_f_one_b_order). The NCCL path follows the documented semantics of
batch_isend_irecv and has not been run here (no GPU).

Timings: perf_counter at the start (waiting), start of compute and end of compute of every
action. On one machine perf_counter is one clock (CLOCK_MONOTONIC) for every process, so the
stages' times line up; on several machines only durations compare.

Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gpulab.distributed.pipeline_split import GPTStage, split_gpt, stage_layers
from gpulab.distributed.schedule import Action, Schedule
from gpulab.distributed.schedule_rules import check_schedule

__all__ = ["ActionTiming", "GPTStage", "PipelineResult", "PipelineStage", "measured_schedule",
           "run_pipeline", "split_gpt", "stage_layers"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAX_DIMS = 8
_HEADER_TAG = 1 << 20  # above every microbatch's tag


@dataclass(frozen=True)
class ActionTiming:
    """When one action ran on its stage (perf_counter seconds)."""

    kind: str  # "F" or "B"
    microbatch: int
    wait_start: float  # the stage turned to this action and began waiting for its input
    start: float  # input in hand: compute begins
    end: float  # compute done (the send is then posted and completes in the background)


@dataclass(frozen=True)
class PipelineResult:
    """What one stage did in one run_pipeline call."""

    stage: int
    n_stages: int
    n_microbatches: int
    losses: tuple[float, ...]  # last stage: each microbatch's loss (unscaled); () elsewhere
    timings: tuple[ActionTiming, ...]  # in the order the stage ran them
    peak_held: int  # most microbatches held at once (forward run, backward not yet)
    t0: float  # perf_counter when every stage had started (after a barrier)

    @property
    def loss(self) -> float | None:
        """The mean of the microbatch losses: the whole batch's mean loss (equal microbatches)."""
        return sum(self.losses) / len(self.losses) if self.losses else None

    def mean_compute(self, kind: str) -> float:
        """Mean compute time of this stage's "F" or "B" actions: tf or tb for the simulator."""
        times = [t.end - t.start for t in self.timings if t.kind == kind]
        return sum(times) / len(times)

    @property
    def waited(self) -> float:
        """Time spent waiting for inputs from the neighbours."""
        return sum(t.start - t.wait_start for t in self.timings)


class PipelineStage:
    """A stage's module and its place in the pipeline: who sends to it and whom it sends to.

    group: the pipeline's process group (ParallelGroups.pp), whose rank order is the stage
    order; None: the default group, stage = global rank. Call it on every rank of the group."""

    def __init__(self, module: torch.nn.Module, stage: int, n_stages: int, group=None,
                 device: torch.device | str | None = None):
        if not dist.is_initialized():
            raise RuntimeError("PipelineStage needs a process group: create it inside "
                               "run_on_ranks (or after dist.init_process_group)")
        self.group = group if group is not None else dist.group.WORLD
        group_size, group_rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if group_size != n_stages or group_rank != stage:
            raise ValueError(f"this rank is {group_rank} of {group_size} in the pipeline's group, "
                             f"but was told it is stage {stage} of {n_stages}: the group's ranks, "
                             "in order, are the stages (use grid.coords(rank).pp_rank)")
        self.module, self.stage, self.n_stages = module, stage, n_stages
        self.prev_rank = dist.get_global_rank(self.group, stage - 1) if stage > 0 else None
        self.next_rank = (dist.get_global_rank(self.group, stage + 1)
                          if stage < n_stages - 1 else None)
        param = next(module.parameters(), None)
        self.device = torch.device(device) if device is not None else (
            param.device if param is not None else torch.device("cpu"))
        self.backend = dist.get_backend(self.group)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    def _op(self, send: bool, tensor, peer: int, tag: int) -> dist.P2POp:
        return dist.P2POp(dist.isend if send else dist.irecv, tensor, peer, self.group, tag)

    def send_header(self, y: torch.Tensor) -> dist.Work:
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        header[0], header[1] = _DTYPES.index(y.dtype), y.dim()
        header[2:2 + y.dim()] = torch.tensor(y.shape)
        return dist.isend(header, self.next_rank, self.group, _HEADER_TAG)

    def recv_header(self) -> tuple[torch.dtype, torch.Size]:
        header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        dist.recv(header, self.prev_rank, self.group, _HEADER_TAG)
        dtype, ndim = _DTYPES[int(header[0])], int(header[1])
        return dtype, torch.Size(header[2:2 + ndim].tolist())


def run_pipeline(stage: PipelineStage, order, microbatches: Sequence | None = None,
                 targets: Sequence | None = None, loss_fn=None,
                 blocking_sends: bool = False) -> PipelineResult:
    """Run stage's list of the per-stage `order` (as gpipe_order returns it: one list per
    stage, the same on every rank); see the module doc. microbatches: the m inputs, needed on
    the first stage only; targets and loss_fn(output, target) -> mean loss: on the last only.

    The order is checked first (check_schedule, the same on every rank), so an order that would
    deadlock raises ScheduleError instead of hanging. blocking_sends=True waits for each send
    to be received before going on (dist.send): GPipe still runs, 1F1B with m > 1 deadlocks."""
    p, s = stage.n_stages, stage.stage
    well_formed = isinstance(order, Sequence) and len(order) == p and isinstance(
        order[s], Sequence)
    m = len(order[s]) // 2 if well_formed else 1
    check_schedule(order, p, max(m, 1))
    if stage.backend == "nccl":
        _check_pairs_in_order(order)
    if stage.is_first and (microbatches is None or len(microbatches) != m):
        raise ValueError(f"the first stage needs the order's {m} microbatches, got "
                         f"{None if microbatches is None else len(microbatches)}")
    if stage.is_last and (targets is None or len(targets) != m or loss_fn is None):
        raise ValueError(f"the last stage needs loss_fn and the {m} targets of the microbatches")
    actions = [(a[0], int(a[1])) for a in order[s]]
    held: dict[int, tuple] = {}  # microbatch -> (input, output or loss / m): what B needs
    losses: dict[int, torch.Tensor] = {}
    timings, sends, peak = [], [], 0
    shape = None  # (dtype, size) of the activations this stage receives
    sent_shape = None  # ... and of those it sends
    dist.barrier(group=stage.group)
    t0 = time.perf_counter()
    received, recv_works = None, []
    for k, (kind, i) in enumerate(actions):
        wait_start = time.perf_counter()
        if k == 0 and not stage.is_first:  # a run's first message: the shape, then the data
            shape = stage.recv_header()
            received, recv_works = _post(stage, [_recv_op(stage, (kind, i), held, shape)], sends)
        for work in recv_works:
            work.wait()
        start = time.perf_counter()
        if kind == "F":
            x = microbatches[i] if stage.is_first else received.requires_grad_()
            y = stage.module(x)
            if stage.is_last:
                loss = loss_fn(y, targets[i])
                losses[i] = loss.detach()
                y = loss / m  # the whole batch's mean: each microbatch weighs 1/m
            held[i] = (x, y)
            peak = max(peak, len(held))
            out = None if stage.is_last else y.detach().contiguous()  # (b, T, C) to send on
        else:
            x, y = held.pop(i)  # once this action ends nothing refers to them: freed
            torch.autograd.backward(y, None if stage.is_last else received)
            out = None if stage.is_first else (
                x.grad if x.grad is not None else torch.zeros_like(x))  # to send back
            del x, y
        end = time.perf_counter()
        timings.append(ActionTiming(kind, i, wait_start, start, end))
        ops = []
        if out is not None:
            if kind == "F":
                sent_shape = _check_sent_shape(stage, out, i, sent_shape, sends)
            peer = stage.next_rank if kind == "F" else stage.prev_rank
            ops.append(stage._op(True, out, peer, i))
        if k + 1 < len(actions):  # paired with this action's send: see the module doc
            ops.append(_recv_op(stage, actions[k + 1], held, shape))
        received, recv_works = _post(stage, ops, sends, blocking_sends)
    for work in sends:
        work.wait()
    return PipelineResult(s, p, m, tuple(losses[i].item() for i in sorted(losses)),
                          tuple(timings), peak, t0)


def _check_sent_shape(stage: PipelineStage, out, i: int, sent_shape, sends: list):
    """The first activation sent in a run goes after a header with its shape; the others must
    have that shape (the receiver allocates its buffers from the header)."""
    if sent_shape is None:
        sends.append(stage.send_header(out))
    elif (out.dtype, out.shape) != sent_shape:
        raise ValueError(f"stage {stage.stage}: microbatch {i}'s output is {tuple(out.shape)} "
                         f"{out.dtype}, the first was {tuple(sent_shape[1])} {sent_shape[0]}: "
                         "split the batch into equal microbatches")
    return (out.dtype, out.shape)


def _recv_op(stage: PipelineStage, action, held, shape) -> dist.P2POp | None:
    """The receive `action` needs: its input activation or its output's gradient (or None)."""
    kind, i = action
    if kind == "F" and not stage.is_first and shape is not None:
        return stage._op(False, torch.empty(shape[1], dtype=shape[0], device=stage.device),
                         stage.prev_rank, i)
    if kind == "B" and not stage.is_last:
        return stage._op(False, torch.empty_like(held[i][1]), stage.next_rank, i)
    return None


def _post(stage: PipelineStage, ops: list, sends: list, blocking_sends: bool = False):
    """Post ops (sends of this action, the receive of the next) as one batch and keep the
    sends' works in `sends`. Returns the receive buffer (or None) and the works to wait for
    before using it."""
    ops = [op for op in ops if op is not None]
    if blocking_sends:  # on gloo dist.send returns once the peer has received the tensor
        for op in [op for op in ops if op.op is dist.isend]:
            dist.send(op.tensor, op.peer, op.group, op.tag)
        ops = [op for op in ops if op.op is dist.irecv]
    buffer = next((op.tensor for op in ops if op.op is dist.irecv), None)
    if not ops:
        return buffer, []
    works = dist.batch_isend_irecv(ops)
    if len(works) != len(ops):
        # A backend that coalesces the batch into one work (NCCL): it completes as a whole.
        return buffer, works
    sends[:] = [w for w in sends if not w.is_completed()]  # drop sends already received
    sends += [w for w, op in zip(works, ops, strict=True) if op.op is dist.isend]
    return buffer, [w for w, op in zip(works, ops, strict=True) if op.op is dist.irecv]


def _check_pairs_in_order(order) -> None:
    """NCCL matches messages between two ranks in order: each stage must receive forwards in the
    order its predecessor runs them, and backwards in the order its successor runs them."""
    for s in range(len(order) - 1):
        for kind in ("F", "B"):
            here = [int(a[1]) for a in order[s] if a[0] == kind]
            there = [int(a[1]) for a in order[s + 1] if a[0] == kind]
            if here != there:
                raise ValueError(f"stages {s} and {s + 1} run their {kind} actions in different "
                                 f"microbatch orders ({here} and {there}); NCCL ignores tags, "
                                 "so messages between them would be matched wrongly")


def measured_schedule(results: Sequence[PipelineResult], name: str = "measured") -> Schedule:
    """Every stage's compute times (one PipelineResult per stage, any order) as a Schedule, in
    seconds from the first stage's start: .bubble_fraction, .peak_in_flight, .text() and
    draw_schedule work on it as on a simulated one. One machine only (see the module doc)."""
    results = sorted(results, key=lambda r: r.stage)
    p, m = results[0].n_stages, results[0].n_microbatches
    if [r.stage for r in results] != list(range(p)):
        raise ValueError(f"need one result per stage 0..{p - 1}, got stages "
                         f"{[r.stage for r in results]}")
    zero = min(r.t0 for r in results)
    actions = tuple(Action(r.stage, t.kind, t.microbatch, 0, t.start - zero, t.end - zero)
                    for r in results for t in r.timings)
    return Schedule(name, p, m, 1, actions)
