"""NaiveDDP, BucketedDDP and OverlappedDDP against single-process training, step by step, on 2
and 3 real gloo ranks; bucketing by hand; overlap, no_sync, unused parameters, ring all-reduce,
groups of one rank and subgroups.

A launch costs a few seconds, so each world size is launched once (a module-scoped fixture) that
runs every scenario and returns parameters after each step; the tests compare them here with
training computed in this process, one model on the whole batch.
"""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpulab.distributed import run_on_ranks
from gpulab.distributed.data_parallel import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    SyncStats,
    assign_buckets,
)
from gpulab.models import MLP

STEPS = 3
BATCH = 12  # divides by 2 and by 3: every rank gets an equal slice
CAP_MB = 800 / 2**20  # 200 fp32 per bucket: see test_assign_buckets_by_hand
WRAPPERS = {"naive": NaiveDDP, "bucketed": BucketedDDP, "overlapped": OverlappedDDP}
TOL = dict(rtol=1e-5, atol=1e-5)  # float32; Adam divides by sqrt(v), which magnifies rounding


def _mlp(seed):
    torch.manual_seed(seed)
    return MLP(8, 3, hidden=16, n_hidden=3)  # 8 parameters, 739 elements


class _SideBranch(nn.Module):
    """An MLP and a side branch that forward takes only when asked."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.body = MLP(8, 3, hidden=16, n_hidden=1)
        self.side = nn.Linear(8, 3)  # registered last: its gradients would come first

    def forward(self, x, use_side=False):
        return self.body(x) + self.side(x) if use_side else self.body(x)


class _TwoBranches(nn.Module):
    """Two parallel branches; `flip` builds b before a, which reverses the order in which
    backward produces their gradients (autograd runs the most recently built node first)."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a, self.b, self.head = nn.Linear(8, 16), nn.Linear(8, 8), nn.Linear(24, 3)

    def forward(self, x, flip=False):
        if flip:
            hb = self.b(x)
            ha = self.a(x)
        else:
            ha = self.a(x)
            hb = self.b(x)
        return self.head(torch.cat([ha.relu(), hb.relu()], dim=1))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 8, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def _optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _sync_of(model):
    if isinstance(model, OverlappedDDP):
        return model.finish_gradient_sync
    return model.sync_gradients if isinstance(model, (NaiveDDP, BucketedDDP)) else None


def _train(model, opt_name, micro_batches, steps=STEPS, keep_grads=False):
    """`steps` optimizer steps, each accumulating the gradients of every micro-batch
    (x, y, forward kwargs, loss weight); a wrapper takes all but the last under no_sync().
    Returns the flat parameters after each step, and the gradients after step 0's first
    backward (what a rank holds locally before any synchronization)."""
    optimizer = _optimizer(opt_name, model.parameters())
    sync = _sync_of(model)
    after, first_grads = [], None
    for step in range(steps):
        optimizer.zero_grad(set_to_none=not keep_grads)
        for j, (x, y, kwargs, weight) in enumerate(micro_batches):
            last = j == len(micro_batches) - 1
            with nullcontext() if last or sync is None else model.no_sync():
                (weight * F.cross_entropy(model(x, **kwargs), y)).backward()
                if sync is not None:
                    sync()  # inside no_sync(): does nothing
            if step == 0 and j == 0:
                first_grads = torch.cat([p.grad.flatten() for p in model.parameters()
                                         if p.grad is not None])
        optimizer.step()
        after.append(_flat(model))
    return after, first_grads


def _reference(model, opt_name, x, y, kwargs=None):
    """One process, whole batch: what every DDP run must reproduce."""
    return _train(model, opt_name, [(x, y, kwargs or {}, 1.0)])[0]


# ---- what the ranks run ---------------------------------------------------------------------

def _ddp_checks(rank, world_size):
    x, y = _data()
    n = BATCH // world_size
    mine = slice(rank * n, (rank + 1) * n)
    whole = [(x[mine], y[mine], {}, 1.0)]
    halves = [(x[mine][:n // 2], y[mine][:n // 2], {}, 0.5),
              (x[mine][n // 2:], y[mine][n // 2:], {}, 0.5)]
    out = {}

    def run(key, ddp, opt_name="sgd", batches=whole, **kwargs):
        params, first_grads = _train(ddp, opt_name, batches, **kwargs)
        out[key] = {"params": params, "first_grads": first_grads, "stats": ddp.stats}
        return ddp

    # Every rank builds its model from a different seed: the wrappers must broadcast rank 0's.
    for name, cls in WRAPPERS.items():
        for opt_name in ("sgd", "adamw"):
            run(f"{name}-{opt_name}", cls(_mlp(rank)), opt_name)
            if name != "naive":
                run(f"{name}-{opt_name}-cap", cls(_mlp(rank), bucket_cap_mb=CAP_MB), opt_name)
        run(f"{name}-no_sync", cls(_mlp(rank), **({} if name == "naive" else
                                                  {"bucket_cap_mb": CAP_MB})), batches=halves)
    run("overlapped-no_sync-keep_grads", OverlappedDDP(_mlp(rank), bucket_cap_mb=CAP_MB),
        "adamw", halves, keep_grads=True)  # grads stay bucket views; no_sync adds into them
    from gpulab.distributed import ring_all_reduce

    run("overlapped-ring", OverlappedDDP(_mlp(rank), CAP_MB, all_reduce=ring_all_reduce))

    # Unused parameters: never used anywhere; then used only on the last rank.
    ddp = OverlappedDDP(_SideBranch(rank), bucket_cap_mb=CAP_MB)
    F.cross_entropy(ddp(x[mine]), y[mine]).backward()
    try:
        ddp.finish_gradient_sync()
        out["unused-error"] = None
    except RuntimeError as error:
        out["unused-error"] = str(error)
    ddp = run("unused-never", OverlappedDDP(_SideBranch(rank), CAP_MB,
                                           find_unused_parameters=True), "adamw")
    out["unused-never"]["side_grads"] = [p.grad for p in ddp.module.side.parameters()]
    side = [(x[mine], y[mine], {"use_side": rank == world_size - 1}, 1.0)]
    run("unused-last-rank", OverlappedDDP(_SideBranch(rank), CAP_MB,
                                          find_unused_parameters=True), "adamw", side)

    # Backward order differs between ranks: buckets must still start in the same order.
    model = _TwoBranches(rank)
    order = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, name=name: order.append(name))
    flip = [(x[mine], y[mine], {"flip": rank % 2 == 1}, 1.0)]
    run("branch-order", OverlappedDDP(model, bucket_cap_mb=320 / 2**20), "sgd", flip)
    out["branch-order"]["hook_order"] = order[:6]  # the first step's

    # Mistakes that must be reported, not silently mis-synchronized.
    ddp = OverlappedDDP(_mlp(rank), bucket_cap_mb=CAP_MB)
    F.cross_entropy(ddp(x[mine]), y[mine]).backward()
    messages = {}
    try:
        ddp(x[mine])
    except RuntimeError as error:
        messages["forward before finish"] = str(error)
    try:
        F.cross_entropy(ddp.module(x[mine]), y[mine]).backward()
    except RuntimeError as error:
        messages["second backward"] = str(error)
    ddp.finish_gradient_sync()  # every bucket had started: the group is clean again
    out["mistakes"] = messages

    # A group of one rank (each rank alone), and a subgroup that leaves rank 0 out.
    alone = [dist.new_group([r]) for r in range(world_size)]  # every rank calls new_group
    run("alone", OverlappedDDP(_mlp(100 + rank), CAP_MB, group=alone[rank]), "adamw")
    members = list(range(1, world_size))
    subgroup = dist.new_group(members)
    if rank in members:
        k = BATCH // len(members)
        part = slice((rank - 1) * k, rank * k)
        run("subgroup", BucketedDDP(_mlp(100 + rank), CAP_MB, group=subgroup), "adamw",
            [(x[part], y[part], {}, 1.0)])
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ddp_run(request):
    return request.param, run_on_ranks(_ddp_checks, request.param, timeout_s=120,
                                         backend="gloo")


def _assert_trains_like(world_size, out, key, want, ranks=None):
    """Parameters identical on every rank after every step, and equal to `want`."""
    ranks = range(world_size) if ranks is None else ranks
    first = min(ranks)
    for step in range(STEPS):
        for rank in ranks:
            assert torch.equal(out[rank][key]["params"][step], out[first][key]["params"][step]), (
                f"{key}, step {step}: rank {rank}'s parameters differ from rank {first}'s; "
                "every rank must apply the same averaged gradient")
        torch.testing.assert_close(
            out[first][key]["params"][step], want[step], **TOL,
            msg=lambda m, s=step: f"{key}, step {s}: DDP != one process on the whole batch. {m}")


# ---- bucketing, in this process -------------------------------------------------------------

def test_assign_buckets_by_hand():
    params = list(_mlp(0).parameters())
    assert [p.numel() for p in params] == [128, 16, 256, 16, 256, 16, 48, 3]
    # 200 fp32 per bucket, reverse order: the head and a bias share a bucket, each 256-element
    # weight (over the cap) is alone, and the last bucket is partial (144 of 200).
    assert assign_buckets(params, CAP_MB) == [[7, 6, 5], [4], [3], [2], [1, 0]]
    assert assign_buckets(params) == [list(range(7, -1, -1))]  # 25 MB: one bucket
    assert assign_buckets(params, 0) == [[i] for i in range(7, -1, -1)]
    mixed = [torch.zeros(2), torch.zeros(2, dtype=torch.float64), torch.zeros(2)]
    assert assign_buckets(mixed) == [[2], [1], [0]], "a bucket is one flat tensor: one dtype"
    assert assign_buckets([]) == []


def test_wrappers_need_a_process_group():
    if dist.is_initialized():
        pytest.skip("this process has a process group")
    for cls in WRAPPERS.values():
        with pytest.raises(RuntimeError, match="run_on_ranks"):
            cls(_mlp(0))


def test_stats_count_overlapped_all_reduces():
    assert SyncStats(grads_after_launch=[5, 0, 2]).buckets_overlapped == 2
    assert SyncStats().buckets_overlapped == 0


# ---- on 2 and 3 ranks -----------------------------------------------------------------------

@pytest.mark.dist
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_each_wrapper_trains_like_one_process(ddp_run, name, opt_name):
    world_size, out = ddp_run
    x, y = _data()
    want = _reference(_mlp(0), opt_name, x, y)  # rank 0's seed: what the broadcast spread
    _assert_trains_like(world_size, out, f"{name}-{opt_name}", want)
    if name != "naive":
        _assert_trains_like(world_size, out, f"{name}-{opt_name}-cap", want)


@pytest.mark.dist
def test_all_reduce_counts_and_overlap(ddp_run):
    _, out = ddp_run
    stats = {key: out[0][key]["stats"] for key in
             ("naive-sgd", "bucketed-sgd", "bucketed-sgd-cap", "overlapped-sgd-cap")}
    assert stats["naive-sgd"].all_reduce_calls == 8, "one all-reduce per parameter"
    assert stats["bucketed-sgd"].all_reduce_calls == 1, "25 MB: one bucket"
    assert stats["bucketed-sgd-cap"].all_reduce_calls == 5
    assert {s.elements_reduced for s in stats.values()} == {739}
    assert stats["bucketed-sgd-cap"].buckets_overlapped == 0, "BucketedDDP waits for backward"
    overlapped = stats["overlapped-sgd-cap"]
    assert overlapped.all_reduce_calls == 5
    assert overlapped.buckets_overlapped >= 1, (
        f"no bucket started before backward ended: {overlapped}")
    assert overlapped.grads_after_launch[0] > 0 and overlapped.grads_after_launch[-1] == 0, (
        "the head's bucket is ready first, the first layer's last")


@pytest.mark.dist
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_no_sync_accumulation_equals_the_full_batch_step(ddp_run, name):
    world_size, out = ddp_run
    x, y = _data()
    _assert_trains_like(world_size, out, f"{name}-no_sync", _reference(_mlp(0), "sgd", x, y))
    local = [out[r][f"{name}-no_sync"]["first_grads"] for r in range(world_size)]
    assert not torch.allclose(local[0], local[1]), "no_sync() must not communicate"
    if name == "overlapped":
        _assert_trains_like(world_size, out, "overlapped-no_sync-keep_grads",
                            _reference(_mlp(0), "adamw", x, y))


@pytest.mark.dist
def test_unused_parameters(ddp_run):
    world_size, out = ddp_run
    x, y = _data()
    message = out[0]["unused-error"]
    assert message is not None, "a bucket that never filled must be an error"
    assert "side.weight" in message and "side.bias" in message
    assert "find_unused_parameters=True" in message
    assert "body" not in message, "only the parameters that got no gradient are named"
    _assert_trains_like(world_size, out, "unused-never",
                        _reference(_SideBranch(0), "adamw", x, y))
    for rank in range(world_size):
        assert out[rank]["unused-never"]["side_grads"] == [None, None], (
            "unused on every rank: param.grad stays None, so AdamW does not decay it")
    n = BATCH // world_size
    slices = [(x[r * n:(r + 1) * n], y[r * n:(r + 1) * n], {"use_side": r == world_size - 1},
               1 / world_size) for r in range(world_size)]
    want = _train(_SideBranch(0), "adamw", slices)[0]  # mean of the slices' losses
    _assert_trains_like(world_size, out, "unused-last-rank", want)


@pytest.mark.dist
def test_ring_all_reduce_gives_the_same_training_without_overlap(ddp_run):
    world_size, out = ddp_run
    x, y = _data()
    _assert_trains_like(world_size, out, "overlapped-ring", _reference(_mlp(0), "sgd", x, y))
    for step in range(STEPS):
        torch.testing.assert_close(out[0]["overlapped-ring"]["params"][step],
                                   out[0]["overlapped-sgd-cap"]["params"][step], **TOL)
    stats = out[0]["overlapped-ring"]["stats"]
    assert stats.all_reduce_calls == 5 and stats.buckets_overlapped == 0


@pytest.mark.dist
def test_buckets_start_in_the_same_order_whatever_order_hooks_fire(ddp_run):
    world_size, out = ddp_run
    orders = [out[r]["branch-order"]["hook_order"] for r in range(world_size)]
    assert orders[0] != orders[1], f"the ranks should see different hook orders: {orders}"
    x, y = _data()
    _assert_trains_like(world_size, out, "branch-order", _reference(_TwoBranches(0), "sgd", x, y))


@pytest.mark.dist
def test_mistakes_are_reported(ddp_run):
    _, out = ddp_run
    messages = out[0]["mistakes"]
    assert "finish_gradient_sync()" in messages.get("forward before finish", "")
    assert "second gradient" in messages.get("second backward", "")


@pytest.mark.dist
def test_groups_of_one_rank_and_subgroups(ddp_run):
    world_size, out = ddp_run
    x, y = _data()
    n = BATCH // world_size
    for rank in range(world_size):  # alone: the rank's own model on its own slice
        mine = slice(rank * n, (rank + 1) * n)
        want = _reference(_mlp(100 + rank), "adamw", x[mine], y[mine])
        _assert_trains_like(world_size, out, "alone", want, ranks=[rank])
    # ranks 1..world_size-1 share the whole batch; their rank 0 is global rank 1
    _assert_trains_like(world_size, out, "subgroup", _reference(_mlp(101), "adamw", x, y),
                        ranks=range(1, world_size))
