"""What Lab 3's checkers run on each rank: the learner's code, between recorders.

Each `*_rank` function is the body of one launch, fn(rank, world_size, ..., log_dir). It runs the
learner's ring, DDP wrapper or training function on inputs the checker chose, records what that
code asked of torch.distributed (harness/calls.py: CallLog), and returns plain tensors and
lists. The checkers (ring.py, simple_ddp.py, fast_ddp.py, train_ddp.py) grade those in the
notebook's process, never here.

    ring_rank    Part 1: dist.all_reduce, then the learner's ring_all_reduce, on each case
    ddp_rank     Parts 2-3: a few optimizer steps through the learner's wrapper, on each case
    train_rank   Part 4: the learner's train_ddp, given StandInDDP (torch's own DDP)

The checkers ship this module by value (cloudpickle), so that a rank imports torch and not
gpulab.checks, whose Lab 1 checkers load Numba (1.5 s per rank): nothing here may import
gpulab.checks. References to torch.distributed's functions are taken before the learner's code
runs, so code that replaces them cannot change what is compared.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpulab.checks.harness.calls import CallLog, log_path

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}



def ring_rank(rank, world_size, ring_all_reduce, cases, log_dir):
    """dist.all_reduce on a copy of this rank's input of every case (all first: a ring that
    misbehaves cannot disturb them), then the learner's ring_all_reduce(tensor, op) on the
    inputs themselves. Returns, per case: the input after the call, what the call returned,
    dist.all_reduce's result, what the ring called, and the size of each message it sent."""
    real_all_reduce = dist.all_reduce  # taken before any learner code runs
    inputs, references = [], []
    for case in cases:
        base = case["inputs"][rank].clone()
        inputs.append(base.t() if case["transposed"] else base)  # a non-contiguous view
        references.append(inputs[-1].clone())
        real_all_reduce(references[-1], op=REDUCE_OPS[case["op"]])
    log, results = CallLog(log_path(log_dir, rank)), []
    for case, x, reference in zip(cases, inputs, references, strict=True):
        log.set_phase(case["label"])
        first, first_sent = len(log.calls), len(log.sent)
        with log.recording():
            returned = ring_all_reduce(x, case["op"])
        results.append({
            "got": x.detach().clone(),
            "returned": returned.detach().clone() if isinstance(returned, torch.Tensor)
            else type(returned).__name__,
            "reference": reference,
            "calls": [c["call"] for c in log.calls[first:]],
            "sent": [m["numel"] for m in log.sent[first_sent:]],  # each message's elements
            "borrowed": list(log.borrowed),
        })
    return results


# ----------------------------------------------------------------------------- Parts 2-3


class Branchy(nn.Module):
    """A body and two heads; forward(x, use_extra) runs the `extra` head only when asked, so
    its parameters get no gradient in a step where no rank, or only some ranks, use it."""

    def __init__(self, n_features: int, n_classes: int, hidden: int):
        super().__init__()
        self.body = nn.Linear(n_features, hidden)
        self.head = nn.Linear(hidden, n_classes)
        self.extra = nn.Linear(hidden, n_classes)

    def forward(self, x, use_extra: bool = False):  # (B, F) -> (B, C)
        h = F.relu(self.body(x))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


class RealModel(nn.Module):
    """What real models bring to DDP: a frozen layer (requires_grad=False, as a pretrained
    embedding kept fixed), a bf16 layer beside fp32 ones, a `branch` that forward(x, use_extra)
    runs only when asked (some ranks use it in a step, others do not), and an `unused` layer that
    no forward ever runs."""

    def __init__(self, n_features: int, n_classes: int, hidden: int):
        super().__init__()
        self.frozen = nn.Linear(n_features, hidden).requires_grad_(False)
        self.body = nn.Linear(hidden, hidden)
        self.low_precision = nn.Linear(hidden, n_classes).to(torch.bfloat16)
        self.branch = nn.Linear(hidden, n_classes)
        self.unused = nn.Linear(hidden, n_classes)

    def forward(self, x, use_extra: bool = False):  # (B, F) -> (B, C)
        h = F.relu(self.body(self.frozen(x)))
        out = self.low_precision(h.to(torch.bfloat16)).float()
        return out + self.branch(h) if use_extra else out


def build_model(spec: dict, seed: int) -> nn.Module:
    """The case's model, initialized from `seed` without touching torch's global random state."""
    from gpulab.models import MLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec["kind"] == "branchy":
            return Branchy(spec["n_features"], spec["n_classes"], spec["hidden"])
        if spec["kind"] == "real":
            return RealModel(spec["n_features"], spec["n_classes"], spec["hidden"])
        return MLP(spec["n_features"], spec["n_classes"], hidden=spec["hidden"],
                   n_hidden=spec["n_hidden"])


def make_optimizer(spec: dict, params) -> torch.optim.Optimizer:
    """The case's optimizer: plain SGD shows any wrong gradient in the parameters; AdamW with
    weight decay also moves a weight whose gradient is zero instead of None."""
    if spec["name"] == "adamw":
        return torch.optim.AdamW(params, lr=spec["lr"], weight_decay=spec["weight_decay"])
    return torch.optim.SGD(params, lr=spec["lr"])


def rank_seed(seed: int, rank: int) -> int:
    """Each rank builds its model from its own seed: the wrapper's broadcast must fix that."""
    return seed + 7919 * rank


def ddp_rank(rank, world_size, ddp_class, cases, log_dir):
    """For each case: len(case["batches"]) optimizer steps of cross-entropy through
    ddp_class(model, **case["kwargs"]), each on this rank's shard of the step's batch. Returns,
    per case, the parameters after construction and after each step, the gradients after each
    finish_gradient_sync, and the calls the wrapper made."""
    return [_ddp_case(rank, world_size, ddp_class, case, log_dir) for case in cases]


def _learners_code():
    """Where the learner's wrapper runs: with torch's default device set to "meta", a device
    that holds no data. A tensor the wrapper makes without saying its device (torch.zeros(n))
    lands there, not beside the parameters, and the checker sees it in the collectives: on a
    GPU with nccl, a buffer left on the CPU fails the same way."""
    return torch.device("meta")


def _ddp_case(rank, world_size, ddp_class, case, log_dir) -> dict:
    device = torch.device("cpu")
    if case["device"] == "cuda":  # nccl: the launcher gave this rank its own GPU
        device = torch.device("cuda", torch.cuda.current_device())
    model = build_model(case["model"], rank_seed(case["seed"], rank)).to(device)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    log = CallLog(log_path(log_dir, rank))
    log.set_phase(f"case: {case['label']}")
    with log.recording(), _learners_code():
        log.set_phase("construct")
        ddp = ddp_class(model, **case["kwargs"])
    torch_ddp = isinstance(ddp, nn.parallel.DistributedDataParallel) or any(
        isinstance(m, nn.parallel.DistributedDataParallel) for m in _modules(ddp))
    start = [p.detach().to("cpu", copy=True) for p in params]
    ready = []  # the checker's own hooks, registered after the learner's: they run after theirs
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: ready.append(1))
    optimizer = make_optimizer(case["optimizer"], params)
    grads, after, unwaited = [], [], []
    for step, (x, y) in enumerate(case["batches"]):
        shard = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
        x, y = x.to(device), y.to(device)
        extra = {} if case["use_extra"] is None else {"use_extra": case["use_extra"][rank]}
        optimizer.zero_grad(set_to_none=True)
        ready.clear()
        with log.recording(), _learners_code():
            log.set_phase("forward", step)
            loss = F.cross_entropy(ddp(x[shard], **extra), y[shard])
            log.set_phase("backward", step)
            log.pending = lambda: len(trainable) - len(ready)
            try:
                loss.backward()
            finally:
                log.pending = None
            log.set_phase("finish", step)
            ddp.finish_gradient_sync()
            log.set_phase("step", step)
        unwaited.append(sum(1 for c in log.calls if c["step"] == step and c["async"]
                            and c["phase"] in ("backward", "finish") and not c["waited"]))
        grads.append([None if p.grad is None else p.grad.detach().to("cpu", copy=True)
                      for p in params])
        optimizer.step()
        after.append([p.detach().to("cpu", copy=True) for p in params])
    return {"start": start, "grads": grads, "params": after, "calls": log.calls,
            "unwaited": unwaited, "borrowed": log.borrowed, "torch_ddp": torch_ddp}


def _modules(obj) -> list:
    modules = getattr(obj, "modules", None)
    if callable(modules):
        try:
            return list(modules())
        except Exception:  # noqa: BLE001 - a learner's odd object: nothing to look into
            return []
    return [v for v in vars(obj).values() if isinstance(v, nn.Module)] if hasattr(
        obj, "__dict__") else []



class StandInDDP(nn.Module):
    """Part 4's wrapper: torch's own DistributedDataParallel (broadcast at construction,
    gradients averaged during backward), so that Part 4 is graded on the data and the loop
    alone. It notes what train_ddp does with it, in the class's `notes`."""

    notes: dict = {}

    def __init__(self, module):
        super().__init__()
        self.inner = nn.parallel.DistributedDataParallel(module)
        self.notes["made"] += 1
        self._versions = None

    @property
    def module(self):
        return self.inner.module

    def forward(self, *args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        self.notes["batch_sizes"].append(None if first is None else int(first.shape[0]))
        self._versions = [p._version for p in self.module.parameters()]
        return self.inner(*args, **kwargs)

    def finish_gradient_sync(self):
        """Nothing left to do: torch's DDP averaged the gradients during backward."""
        self.notes["finished"] += 1
        versions = [p._version for p in self.module.parameters()]
        if self._versions is not None and versions != self._versions:
            self.notes["stepped_first"] += 1  # the parameters changed since the forward pass


def train_rank(rank, world_size, train_ddp, dataset, kwargs, log_dir):
    """The learner's train_ddp(rank, world_size, StandInDDP, dataset, **kwargs), with
    DistributedSampler's set_epoch counted. Returns its (losses, state) and the notes."""
    from torch.utils.data.distributed import DistributedSampler

    StandInDDP.notes = {"made": 0, "batch_sizes": [], "finished": 0, "stepped_first": 0}
    epochs = []
    real_set_epoch = DistributedSampler.set_epoch

    def set_epoch(self, epoch):
        epochs.append(int(epoch))
        return real_set_epoch(self, epoch)

    DistributedSampler.set_epoch = set_epoch
    try:
        result = train_ddp(rank, world_size, StandInDDP, dataset, **kwargs)
    finally:
        DistributedSampler.set_epoch = real_set_epoch
    return {"result": _plain(result), "notes": dict(StandInDDP.notes), "set_epoch": epochs}


def _plain(value, depth: int = 0):
    """The learner's return value as lists, dicts, numbers and CPU tensors (copies)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if depth > 3:
        return type(value).__name__
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v, depth + 1) for v in value)
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return type(value).__name__
