"""Distributed data parallel (DDP) from scratch, in three steps.

Every rank holds a full copy of the model and takes its own slice of the batch. After backward,
the ranks average their gradients (sum, then divide by world_size), so every copy takes the same
optimizer step as one process training on the whole batch.

    ddp = OverlappedDDP(MLP(16, 4))                 # in run_on_ranks: copies start equal
    loss_fn(ddp(x[mine]), y[mine]).backward()       # hooks all-reduce full buckets meanwhile
    ddp.finish_gradient_sync()                      # wait, average: the mean in param.grad
    optimizer.step()

    with ddp.no_sync():                             # accumulate a micro-batch, no traffic
        loss_fn(ddp(x1), y1).backward()

NaiveDDP       after backward, finish_gradient_sync(): one all-reduce per parameter gradient
BucketedDDP    after backward, finish_gradient_sync(): gradients packed into a few flat buckets,
               one all-reduce per bucket (fewer, larger messages: less latency paid)
OverlappedDDP  hooks start a bucket's async all-reduce as soon as backward has produced all its
               gradients; finish_gradient_sync() waits for them. Communication hides behind the
               rest of backward, as in torch.nn.parallel.DistributedDataParallel
no_sync()      on all three: backward inside it only accumulates local gradients; the next
               synchronized step reduces the sum (gradient accumulation without extra traffic)
assign_buckets which parameters share a bucket (reverse registration order, one dtype and
               device per bucket, at most bucket_bytes)
SyncStats      ddp.stats: what the last synchronized step did (all-reduces, overlap)

As in torch DDP: frozen parameters (requires_grad=False) get no gradient and no communication;
NaiveDDP and BucketedDDP need a gradient for every other parameter (torch DDP without
find_unused_parameters does too); OverlappedDDP(find_unused_parameters=True) leaves None where no
rank used a parameter and averages with zeros where only some did.

Taught in: lessons/05_multi_gpu_strategies.ipynb
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

DEFAULT_BUCKET_BYTES = 25 * 2**20  # torch DDP's default, bucket_cap_mb=25, in bytes


@dataclass
class SyncStats:
    """What gradient synchronization did in the last synchronized step (`ddp.stats`)."""

    all_reduce_calls: int = 0  # gradient all-reduces started: one per parameter or per bucket
    elements_reduced: int = 0  # gradient elements that went through them
    # Per all-reduce, in launch order: how many parameter gradients backward still produced
    # after it started. 0 means it started after backward: nothing to hide behind.
    grads_after_launch: list[int] = field(default_factory=list)

    @property
    def buckets_overlapped(self) -> int:
        """All-reduces that started while backward was still computing gradients."""
        return sum(n > 0 for n in self.grads_after_launch)


def assign_buckets(params: list[torch.Tensor],
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Group parameters into buckets of at most bucket_bytes; returns the indices into `params`
    of each bucket, in the order the buckets were opened.

    Last parameter first: backward produces the last layer's gradients first, so the first
    bucket fills (and can be sent) while earlier layers are still being differentiated. A bucket
    is one flat tensor, so it holds one kind of parameter (dtype and device) and each kind keeps
    its own open bucket: a parameter joins the open bucket of its kind, which is closed first if
    the parameter would take it past bucket_bytes (so a parameter larger than the cap is alone).
    (torch DDP's cap is a threshold instead: a bucket closes once it reaches the cap, so it can
    pass the cap by one parameter, and at the same cap torch makes fewer, larger buckets. torch
    also lists its buckets in the order they closed, and by default caps its first one at 1 MiB.)
    """
    buckets: list[list[int]] = []
    open_bucket: dict[tuple[torch.dtype, torch.device], int] = {}  # kind -> index in buckets
    filled: list[int] = []  # bytes in each bucket
    for i in reversed(range(len(params))):
        p = params[i]
        kind, nbytes = (p.dtype, p.device), p.numel() * p.element_size()
        b = open_bucket.get(kind)
        if b is None or filled[b] + nbytes > bucket_bytes:
            b = open_bucket[kind] = len(buckets)  # closes the kind's previous bucket, if any
            buckets.append([])
            filled.append(0)
        buckets[b].append(i)
        filled[b] += nbytes
    return buckets


def broadcast_from_rank0(module: nn.Module, group=None) -> None:
    """Overwrite every parameter and buffer with the group's rank 0 copy: all ranks start equal
    (different seeds on different ranks would otherwise train different models)."""
    src = 0 if group is None else dist.get_global_rank(group, 0)  # broadcast takes a global rank
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src, group=group)


class Bucket:
    """Parameters whose gradients travel together: one flat buffer, a slot for each. The buffer
    has the parameters' dtype and lives on their device, so all must share both."""

    def __init__(self, params: list[nn.Parameter]):
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(f"a bucket holds parameters of one dtype and device, got {kinds}")
        self.params = params
        n = sum(p.numel() for p in params)
        self.buffer = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)  # (n,)
        self.slots, offset = [], 0  # slot k: the piece of buffer shaped like params[k]
        for p in params:
            self.slots.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


class _DataParallel(nn.Module):
    """What the three wrappers share: start equal, pass forward through, no_sync()."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"{type(self).__name__} averages gradients across ranks, so it needs a process "
                "group: build it inside a function run by gpulab.distributed.run_on_ranks (or "
                "after dist.init_process_group). For one rank, that is run_on_ranks(fn, 1).")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.require_sync = True  # False inside no_sync()
        self.stats = SyncStats()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]  # frozen parameters need no gradient sync
        self.grad_params = [p for _, p in named]
        broadcast_from_rank0(module, group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate into param.grad on this rank only; the first
        synchronized step after it averages the accumulated sum across ranks. (NaiveDDP and
        BucketedDDP communicate only in finish_gradient_sync(), which does nothing in here.)"""
        before, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = before

    def _names(self, indices: list[int]) -> str:
        names = [self.param_names[i] for i in indices]
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        return ", ".join(names[:5]) + more

    def _check_every_param_has_grad(self) -> None:
        # Every rank must issue the same all-reduces; skipping a None gradient on one rank but
        # not on another would pair up the wrong tensors.
        missing = [i for i, p in enumerate(self.grad_params) if p.grad is None]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} needs a gradient for every parameter that is not "
                f"frozen, but {self._names(missing)} got none (a branch unused in forward?). "
                "Use OverlappedDDP(..., find_unused_parameters=True) for such models.")


class NaiveDDP(_DataParallel):
    """Step 1: after loss.backward(), finish_gradient_sync() all-reduces each gradient on its
    own. Correct, but pays one message's latency per parameter, and only after backward ends."""

    def finish_gradient_sync(self) -> None:
        if not self.require_sync:
            return  # inside no_sync(): keep accumulating locally
        self._check_every_param_has_grad()
        stats = SyncStats()
        for p in self.grad_params:  # the same order on every rank
            dist.all_reduce(p.grad, group=self.group)  # sum over ranks, in place
            p.grad.div_(self.world_size)  # the mean, as if one process saw the whole batch
            stats.all_reduce_calls += 1
            stats.elements_reduced += p.numel()
            stats.grads_after_launch.append(0)
        self.stats = stats


class BucketedDDP(_DataParallel):
    """Step 2: gradients are packed into flat buckets (see assign_buckets), one all-reduce each.

    param.grad stays its own tensor: finish_gradient_sync() copies each gradient into its
    bucket's slot, reduces, and copies the mean back. That costs two copies per step, but
    param.grad never changes identity, so anything holding it (an optimizer,
    zero_grad(set_to_none=True) replacing it with None) works as without DDP. OverlappedDDP
    shows the alternative."""

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES, group=None):
        super().__init__(module, group)
        self.buckets = [Bucket([self.grad_params[i] for i in bucket])
                        for bucket in assign_buckets(self.grad_params, bucket_bytes)]

    def finish_gradient_sync(self) -> None:
        if not self.require_sync:
            return
        self._check_every_param_has_grad()
        stats = SyncStats()
        for bucket in self.buckets:
            for p, slot in zip(bucket.params, bucket.slots, strict=True):
                slot.copy_(p.grad)
            dist.all_reduce(bucket.buffer, group=self.group)
            bucket.buffer.div_(self.world_size)
            for p, slot in zip(bucket.params, bucket.slots, strict=True):
                p.grad.copy_(slot)
            stats.all_reduce_calls += 1
            stats.elements_reduced += bucket.buffer.numel()
            stats.grads_after_launch.append(0)
        self.stats = stats


class OverlappedDDP(_DataParallel):
    """Step 3: all-reduce buckets while backward is still running, as torch DDP does.

    A hook on each parameter (register_post_accumulate_grad_hook) runs right after backward has
    written that parameter's gradient. When a bucket has all of its gradients, the hook starts
    an async all-reduce on the bucket (dist.all_reduce(..., async_op=True)) and backward goes on
    to earlier layers while the message travels. finish_gradient_sync(), called after
    loss.backward() and before optimizer.step(), waits for every bucket and divides by
    world_size.

    param.grad becomes a view into its bucket (torch DDP's gradient_as_bucket_view=True): the
    hook copies a fresh gradient into its slot once and points param.grad at the slot, the
    average is computed in place, and no copy back is needed. Later backward passes accumulate
    straight into the bucket; after zero_grad(set_to_none=True) the next gradient is a fresh
    tensor again and is copied in again. The optimizer only sees an ordinary param.grad.

    bucket_bytes: the cap on a bucket's bytes (see assign_buckets).
    all_reduce: a synchronous, in-place fn(tensor, group=...) to use instead of dist.all_reduce
        (e.g. gpulab.distributed.ring_all_reduce). It cannot run in the background, so the
        buckets are then reduced one after another in finish_gradient_sync(): no overlap.
    find_unused_parameters: parameters that get no gradient in a backward (a branch not taken)
        count as zero and their buckets are reduced at finish time (later than necessary:
        torch DDP finds them by walking the autograd graph after forward, so that their
        buckets can still start during backward). A parameter no rank used keeps
        param.grad None, as in one process. Without the flag, such a step raises at
        finish_gradient_sync(), naming the parameters.
    """

    def __init__(self, module: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 all_reduce=None, find_unused_parameters: bool = False, group=None):
        super().__init__(module, group)
        self.all_reduce = all_reduce
        self.find_unused_parameters = find_unused_parameters
        self.buckets, self.slot_of = [], {}  # slot_of[param index] = (bucket index, slot index)
        for b, indices in enumerate(assign_buckets(self.grad_params, bucket_bytes)):
            self.buckets.append(Bucket([self.grad_params[i] for i in indices]))
            self.slot_of.update({i: (b, k) for k, i in enumerate(indices)})
        # Hooks live on the parameters, not on this wrapper: a second wrapper around the same
        # module (a notebook cell run twice) takes over, or both would send every bucket.
        for handle in getattr(module, "_ddp_hook_handles", []):
            handle.remove()
        module._ddp_hook_handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.grad_params)]
        self._start_step()

    def _start_step(self) -> None:
        self._ready = [False] * len(self.grad_params)  # got its gradient in this backward
        self._waiting_for = [len(b.params) for b in self.buckets]  # gradients each bucket lacks
        self._next_bucket = 0  # buckets start in index order, the same on every rank
        self._works = []  # one async handle per started bucket (None: already done)
        self._grads_seen = 0
        self._grads_seen_at_launch = []

    def forward(self, *args, **kwargs):
        if self._grads_seen:
            raise RuntimeError("the previous backward's gradients were never synchronized: "
                               "call ddp.finish_gradient_sync() after loss.backward(), "
                               "before optimizer.step().")
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, i: int, param: nn.Parameter) -> None:
        """Runs inside backward, right after param.grad got this backward's contribution."""
        if not self.require_sync:
            return  # no_sync(): the gradient just accumulates in param.grad
        if self._ready[i]:
            raise RuntimeError(f"{self.param_names[i]} got a second gradient before "
                               "finish_gradient_sync(): call it after every backward.")
        self._ready[i] = True
        self._grads_seen += 1
        b, k = self.slot_of[i]
        slot = self.buckets[b].slots[k]
        if param.grad.data_ptr() != slot.data_ptr():  # a fresh gradient: move it into the bucket
            slot.copy_(param.grad)
            param.grad = slot
        self._waiting_for[b] -= 1
        if self.all_reduce is None:  # a synchronous all_reduce waits for finish (see docstring)
            self._start_ready_buckets()

    def _start_ready_buckets(self) -> None:
        # Hooks may complete bucket 3 before bucket 2 (and in another order on another rank).
        # Collectives pair up by call order, so every rank must start the buckets in the same
        # order: bucket k only once buckets 0..k-1 have started, as torch DDP does.
        while self._next_bucket < len(self.buckets) and not self._waiting_for[self._next_bucket]:
            self._start_bucket(self._next_bucket)

    def _start_bucket(self, b: int) -> None:
        buffer = self.buckets[b].buffer
        if self.all_reduce is None:
            self._works.append(dist.all_reduce(buffer, group=self.group, async_op=True))
        else:
            self.all_reduce(buffer, group=self.group)
            self._works.append(None)
        self._grads_seen_at_launch.append(self._grads_seen)
        self._next_bucket += 1

    def finish_gradient_sync(self) -> None:
        """Call after loss.backward(), before optimizer.step(): start the buckets still waiting,
        wait for all, and leave the mean gradient in every param.grad."""
        if not self.require_sync:
            return  # inside no_sync(): nothing was sent, nothing to wait for
        unused = [i for i, ready in enumerate(self._ready) if not ready]
        if unused and not self.find_unused_parameters:
            self._wait_and_reset()  # finish what was started, so the group stays usable
            raise RuntimeError(
                f"{self._names(unused)} got no gradient in this backward, so "
                f"{len(self.buckets) - self._next_bucket} of {len(self.buckets)} buckets could "
                "never be all-reduced. If the model has parameters that forward does not "
                "always use, pass OverlappedDDP(..., find_unused_parameters=True).")
        for i in unused:  # a parameter this rank did not use contributes what it holds, or 0
            p, (b, k) = self.grad_params[i], self.slot_of[i]
            slot = self.buckets[b].slots[k]
            if p.grad is None:
                slot.zero_()
            elif p.grad.data_ptr() != slot.data_ptr():
                slot.copy_(p.grad)
        # Every rank starts every bucket, in index order, unused parameters or not: if one rank
        # skipped a bucket, its next all-reduce would pair up with another rank's different
        # bucket (wrong sums, a size mismatch, or a hang).
        while self._next_bucket < len(self.buckets):
            self._start_bucket(self._next_bucket)
        if self.find_unused_parameters and self.buckets:
            # Every rank runs this all-reduce at every step, whether or not it has unused
            # parameters itself: a collective that only some ranks call hangs the others.
            has_grad = torch.tensor([float(self._ready[i] or p.grad is not None)
                                     for i, p in enumerate(self.grad_params)],
                                    device=self.buckets[0].buffer.device)
            dist.all_reduce(has_grad, group=self.group)  # > 0: some rank has a gradient
            has_grad = has_grad.tolist()
        stats = SyncStats(all_reduce_calls=len(self._works),
                          elements_reduced=sum(b.buffer.numel() for b in self.buckets),
                          grads_after_launch=[self._grads_seen - n
                                              for n in self._grads_seen_at_launch])
        self._wait_and_reset()
        for bucket in self.buckets:
            bucket.buffer.div_(self.world_size)
        for i in unused:
            p, (b, k) = self.grad_params[i], self.slot_of[i]
            # Unused on every rank: leave param.grad None, so that the optimizer skips it (no
            # weight decay, no momentum), as it would in one process. Otherwise: the mean.
            if has_grad[i] > 0:
                p.grad = self.buckets[b].slots[k]
        self.stats = stats

    def _wait_and_reset(self) -> None:
        for work in self._works:
            if work is not None:
                work.wait()
        self._start_step()
