"""A training step on paper: which tensors are live after every op, by category, and the peak.

gpulab.memory.estimate describes a model's forward pass op by op with sizes only ("paper
tensors"); PaperStep replays what autograd and the optimizer do with them and keeps the books
the way MemoryTracker keeps them for a real step, so the two can be compared category by
category.

    step = PaperStep()
    w = step.parameter(10 * 64, 4)                       # elements, bytes per element
    x = step.batch(32 * 64, 4)
    (y,) = step.op("addmm", [x, w], [(32 * 10, 4)], saves=[x], grads=[w])
    step.backward(y)
    step.optimizer_step("adam")
    step.peak_bytes, step.peak_breakdown

The rules, each checked against MemoryTracker on the course's models (tests/test_memory_*):
  forward     an op's outputs are allocated while its inputs are live (peaks are taken there);
              a tensor is freed once the program has dropped it (release) and no op saved it.
  backward    ops run in reverse order of creation, which is autograd's order for these graphs.
              An op allocates the gradients of its inputs while its incoming gradient and all
              saved tensors are live; then it frees the incoming gradient and what it saved, and
              hands each new gradient on. A second gradient for the same tensor is added out of
              place (a new tensor, then both addends go). An add passes its incoming gradient on
              without a copy (alias). A parameter keeps the gradient it receives as its .grad.
  autocast    the low-precision copy of a parameter is cached until the autocast region ends
              (end_autocast); if an op saved it, it lives until that op's backward.
  checkpoint  ops inside a checkpointed region save nothing in forward; in backward, the first
              op that needs a saved tensor re-runs the region up to its last saving op.
  optimizer   see optimizer_step.
Storages count once; on CUDA each is rounded up to the caching allocator's 512-byte blocks.
Taught in: lessons/07_gpu_memory.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.memory.breakdown import CATEGORIES, MemoryBreakdown
from gpulab.memory.tracker import allocated_bytes

ALIAS = "alias"  # in `grads`: the op passes its incoming gradient on (add), no new tensor


class PaperTensor:
    """A tensor's size and role, with no data: numel elements of itemsize bytes."""

    __slots__ = ("numel", "itemsize", "category", "requires_grad", "is_param", "nbytes", "refs",
                 "live", "name")

    def __init__(self, numel, itemsize, category, requires_grad, is_param, nbytes, name=""):
        self.numel, self.itemsize, self.category = numel, itemsize, category
        self.requires_grad, self.is_param, self.nbytes = requires_grad, is_param, nbytes
        self.refs, self.live, self.name = 0, False, name

    def __repr__(self):
        return f"PaperTensor({self.name or '?'}, {self.nbytes} bytes, {self.category})"


@dataclass(eq=False)
class _Op:
    name: str
    outputs: list
    saves: list  # held now
    grads: dict  # input -> ALIAS, or the input itself (a new gradient of its size)
    region: _Region | None = None  # the checkpointed region it ran in, if any
    deferred_saves: list = field(default_factory=list)  # in a region: saved on recompute


@dataclass(eq=False)
class _Region:
    inputs: list
    events: list = field(default_factory=list)  # ("op", _Op) and ("release", tensor) in order
    recomputed: bool = False


class PaperStep:
    """The live bytes of one training step on paper, by category; see the module docstring.

    state_itemsizes: the optimizer state of each parameter, one tensor of its shape per entry
    (fp32 Adam: [4, 4] for exp_avg and exp_avg_sq); it exists from the second step on, so it is
    live from the start. state_step_bytes: Adam's step count per parameter (a 4-byte scalar
    on the parameter's device on CPU; CUDA parameters keep it on the host: 0).
    param_shards, grad_shards, optimizer_shards: how many ranks split each parameter, gradient
    and optimizer state (1 without sharding; world_size under the matching ZeRO stage).
    """

    def __init__(self, device_type: str = "cpu", state_itemsizes=(), state_step_bytes: int = 0,
                 param_shards: int = 1, grad_shards: int = 1, optimizer_shards: int = 1):
        self.device_type = device_type
        self.state_itemsizes, self.state_step_bytes = list(state_itemsizes), state_step_bytes
        # the optimizer's scratch has the dtype of its state
        self.state_itemsize = self.state_itemsizes[-1] if self.state_itemsizes else 4
        self.param_shards, self.grad_shards = param_shards, grad_shards
        self.optimizer_shards = optimizer_shards
        self.phase = "forward"
        self.bytes = dict.fromkeys(CATEGORIES, 0)
        self.live_bytes = 0
        self.peak_bytes, self.peak_breakdown, self.peak_phase, self.peak_op = 0, None, "", ""
        self.saved_at_end_of_forward = 0  # activation bytes live when backward starts
        # (what autograd saved, plus the loss: the "activation memory" of the napkin sum)
        self.params: list[PaperTensor] = []
        self.grads: dict[PaperTensor, PaperTensor] = {}
        self._ops: list[_Op] = []
        self._cache: dict[PaperTensor, PaperTensor] = {}  # autocast: parameter -> its cast
        self._region: _Region | None = None
        self.timeline: list[tuple[str, int]] = []  # (phase, live bytes) from the first op on
        self._started = False

    # ------------------------------------------------------------ books

    def _alloc(self, numel, itemsize, category=None, requires_grad=False, is_param=False,
               shards=1, name="") -> PaperTensor:
        if category is None:
            category = "activations" if self.phase == "forward" else "temporary"
        nbytes = allocated_bytes(-(-int(numel * itemsize) // shards), self.device_type)
        t = PaperTensor(numel, itemsize, category, requires_grad, is_param, nbytes, name)
        t.live = True
        self.bytes[category] += t.nbytes
        self.live_bytes += t.nbytes
        self._record()
        return t

    def _record(self) -> None:
        if self._started:  # parameters, state and batch exist before the step: not events
            self.timeline.append((self.phase, self.live_bytes))

    def hold(self, t: PaperTensor) -> None:
        """Take a reference: t stays live until every holder has released or dropped it."""
        t.refs += 1

    def _drop(self, t: PaperTensor) -> None:
        t.refs -= 1
        if t.refs == 0 and t.live:
            t.live = False
            self.bytes[t.category] -= t.nbytes
            self.live_bytes -= t.nbytes
            self._record()

    def _relabel(self, t: PaperTensor, category: str) -> None:
        self.bytes[t.category] -= t.nbytes
        self.bytes[category] += t.nbytes
        t.category = category

    def _peak(self, where: str) -> None:
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_breakdown = MemoryBreakdown(**self.bytes)
            self.peak_phase, self.peak_op = self.phase, where

    # ------------------------------------------------------------ what exists before the step

    def parameter(self, numel: int, itemsize: int, name: str = "") -> PaperTensor:
        """A weight, held for the whole step, with its optimizer state (see __init__)."""
        t = self._alloc(numel, itemsize, "parameters", requires_grad=True, is_param=True,
                        shards=self.param_shards, name=name)
        self.hold(t)
        self.params.append(t)
        for state_itemsize in self.state_itemsizes:
            self.hold(self._alloc(numel, state_itemsize, "optimizer",
                                   shards=self.optimizer_shards))
        if self.state_step_bytes:
            self.hold(self._alloc(1, self.state_step_bytes, "optimizer"))
        return t

    def batch(self, numel: int, itemsize: int, name: str = "batch") -> PaperTensor:
        """An input or target tensor, made before the step and held through it."""
        t = self._alloc(numel, itemsize, "other", name=name)
        self.hold(t)
        return t

    def workspace(self, nbytes: int, name: str = "workspace") -> PaperTensor:
        """Temporary memory held until release() (ZeRO-3's gathered parameters)."""
        t = self._alloc(nbytes, 1, "temporary", name=name)
        self.hold(t)
        return t

    # ------------------------------------------------------------ forward

    def op(self, name: str, inputs, outputs, saves=(), grads=(), differentiable=True):
        """Run an op: inputs (PaperTensors, None is skipped), outputs as (numel, itemsize)
        pairs. saves: tensors kept for backward (inputs, or ints naming outputs by position).
        grads: the inputs that get a gradient of their own size in backward, or a dict
        {input: ALIAS} for ones that get the incoming gradient itself. Returns the outputs,
        held by the program until release()."""
        self._started = True
        inputs = [t for t in inputs if t is not None]
        needs_grad = differentiable and any(t.requires_grad for t in inputs)
        outs = [self._alloc(n, size, requires_grad=needs_grad, name=name) for n, size in outputs]
        for t in outs:
            self.hold(t)
        self._peak(name)
        if needs_grad:  # autograd records the op (and keeps what it saves) only then
            saved = [outs[s] if isinstance(s, int) else s for s in saves]
            spec = grads if isinstance(grads, dict) else dict.fromkeys(grads)
            spec = {t: (ALIAS if how == ALIAS else t) for t, how in spec.items()
                    if t is not None and t.requires_grad}
            if self._region is None:
                op = _Op(name, outs, saved, spec)
                for t in saved:
                    self.hold(t)
            else:  # torch.utils.checkpoint's pack hook keeps nothing
                op = _Op(name, outs, [], spec, self._region, saved)
                self._region.events.append(("op", op))
            self._ops.append(op)
        return outs

    def release(self, *tensors) -> None:
        """The program drops its reference (a local goes out of scope, a temporary is used)."""
        for t in tensors:
            if t is not None:
                if self._region is not None:
                    self._region.events.append(("release", t))
                self._drop(t)

    def cast(self, t: PaperTensor, itemsize: int) -> PaperTensor:
        """Autocast's copy of t in another dtype (t itself when it already has that itemsize).
        A parameter's copy is cached: made once per autocast region, held until end_autocast.
        The caller releases the returned tensor like any other op output."""
        if t.itemsize == itemsize:
            self.hold(t)
            return t
        if t.is_param and t in self._cache:
            self.hold(self._cache[t])
            return self._cache[t]
        (out,) = self.op("cast", [t], [(t.numel, itemsize)], grads=[t])
        if t.is_param:
            self._cache[t] = out
            self.hold(out)  # the cache's reference
        return out

    def end_autocast(self) -> None:
        """Leaving torch.autocast empties its cache of parameter copies."""
        for t in self._cache.values():
            self._drop(t)
        self._cache.clear()

    def begin_checkpoint(self, *inputs) -> None:
        """Start a region run under torch.utils.checkpoint (non-reentrant): it keeps `inputs`
        to re-run the region in backward, and saves nothing else."""
        self._region = _Region(list(inputs))
        for t in inputs:
            self.hold(t)

    def end_checkpoint(self) -> None:
        self._region = None

    # ------------------------------------------------------------ backward

    def backward(self, loss: PaperTensor) -> None:
        """loss.backward(): every recorded op in reverse order, then .grad on each parameter."""
        self.saved_at_end_of_forward = self.bytes["activations"]
        # torch.autograd.backward makes ones_like(loss) before the engine starts, and its frame
        # holds it until the engine is done.
        seed = self._alloc(1, loss.itemsize, "activations")
        self.hold(seed)
        self.hold(seed)
        self.phase = "backward"
        buffers: dict[PaperTensor, PaperTensor] = {loss: seed}
        for op in reversed(self._ops):
            incoming = [buffers.pop(t) for t in op.outputs if t in buffers]
            if not incoming:
                continue  # no gradient reached this op
            if op.deferred_saves and not op.region.recomputed:
                self._recompute(op.region)  # the first unpack of a saved tensor triggers it
            new = {}
            for t, how in op.grads.items():
                if how == ALIAS:
                    new[t] = incoming[0]
                    self.hold(incoming[0])
                else:
                    new[t] = self._alloc(t.numel, t.itemsize)
                    self.hold(new[t])
            self._peak(op.name)
            for g in incoming:
                self._drop(g)
            for t in op.saves:
                self._drop(t)
            for t, g in new.items():
                self._deliver(t, g, buffers)
        self._drop(seed)

    def _deliver(self, t: PaperTensor, g: PaperTensor, buffers: dict) -> None:
        if t.is_param:
            if t in self.grads:  # a second use of the weight: added in place into .grad
                self._drop(g)
            elif self.grad_shards == 1:
                self._relabel(g, "gradients")  # AccumulateGrad keeps the tensor as .grad
                self.grads[t] = g
            else:  # ZeRO-2/3: reduce-scatter, keep this rank's shard, free the full gradient
                shard = self._alloc(t.numel, g.itemsize, "gradients", shards=self.grad_shards)
                self.hold(shard)
                self._peak("reduce-scatter")
                self._drop(g)
                self.grads[t] = shard
        elif t in buffers:  # autograd sums two gradients out of place
            total = self._alloc(t.numel, g.itemsize)
            self.hold(total)
            self._peak("accumulate")
            self._drop(buffers[t])
            self._drop(g)
            buffers[t] = total
        else:
            buffers[t] = g

    def _recompute(self, region: _Region) -> None:
        """Re-run a checkpointed region's forward up to its last saving op (early stop)."""
        region.recomputed = True
        last = max(i for i, (kind, x) in enumerate(region.events)
                   if kind == "op" and x.deferred_saves)
        revived = []  # outputs the re-run holds, as the program did in forward
        for kind, x in region.events[:last + 1]:
            if kind == "op":
                for t in x.outputs:
                    if not t.live:  # freed after the forward: allocated again, in backward
                        t.category, t.live = "temporary", True
                        self.bytes["temporary"] += t.nbytes
                        self.live_bytes += t.nbytes
                    self.hold(t)
                    revived.append(t)
                x.saves = x.deferred_saves
                for t in x.saves:
                    self.hold(t)
                self._peak("recompute " + x.name)
            elif x in revived:
                revived.remove(x)
                self._drop(x)
        for t in revived:  # the early stop drops whatever the re-run still held
            self._drop(t)
        for t in region.inputs:
            self._drop(t)

    # ------------------------------------------------------------ optimizer

    def optimizer_step(self, kind: str, foreach: bool | None = None, fused: bool = False) -> None:
        """The update's scratch memory (its state is there from the start: see __init__).

        SGD (with or without momentum) updates in place: no scratch. Adam's single-tensor loop
        (the CPU default) computes denom = sqrt(v) / c + eps one parameter at a time: sqrt(v)
        and denom of the current parameter, and the previous denom until it is reassigned.
        The foreach version (the CUDA default) computes sqrt(v) for all parameters at once.
        A fused kernel (fused=True; what Megatron-LM and DeepSpeed run) needs no scratch.
        """
        self.phase = "optimizer"
        if kind in ("adam", "adamw") and not fused:
            foreach = self.device_type in ("cuda", "xpu") if foreach is None else foreach

            def scratch(p):
                t = self._alloc(p.numel, self.state_itemsize, shards=self.optimizer_shards)
                self.hold(t)
                return t

            if foreach:
                roots = [scratch(p) for p in self.params]
                self._peak("_foreach_sqrt")
                for t in roots:
                    self._drop(t)
            else:
                previous = None
                for p in self.params:
                    root, denom = scratch(p), scratch(p)
                    self._peak("adam denom")
                    self._drop(root)
                    if previous is not None:
                        self._drop(previous)
                    previous = denom
                if previous is not None:
                    self._drop(previous)
        elif kind not in ("sgd", "sgd-momentum", "adam", "adamw"):
            raise ValueError(f"unknown optimizer {kind!r}: choose sgd, sgd-momentum, adam, adamw")
        self._peak("step")
