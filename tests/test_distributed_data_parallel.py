"""NaiveDDP, BucketedDDP and OverlappedDDP against single-process training, step by step, on 2
and 3 real gloo ranks; bucketing by hand; overlap, no_sync, unused parameters, ring all-reduce,
groups of one rank and subgroups; torch DDP's rules for frozen, unused and partly used
parameters and bf16 beside fp32 (tests/real_model.py); buffers on their parameters' device.

A launch costs a few seconds, so each world size is launched once (a module-scoped fixture) that
runs every scenario and returns parameters after each step; the tests compare them here with
training computed in this process, one model on the whole batch.
"""

from contextlib import contextmanager, nullcontext
from unittest import mock

import pytest
import real_model
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpulab.distributed import run_on_ranks
from gpulab.distributed.data_parallel import (
    Bucket,
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    SyncStats,
    assign_buckets,
)
from gpulab.models import MLP

STEPS = 3
BATCH = 12  # divides by 2 and by 3: every rank gets an equal slice
CAP_BYTES = 800  # 200 fp32 per bucket: see test_assign_buckets_by_hand
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
    return getattr(model, "finish_gradient_sync", None)  # None: one process, nothing to sync


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


@contextmanager
def _broadcast_skips_meta():
    """Meta tensors have shapes and no data, and gloo cannot send them: while this is active,
    the wrappers' construction-time broadcast passes over them (a patch for tests only)."""
    real_broadcast = dist.broadcast

    def broadcast(tensor, *args, **kwargs):
        return None if tensor.is_meta else real_broadcast(tensor, *args, **kwargs)

    with mock.patch.object(dist, "broadcast", broadcast):
        yield


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
                run(f"{name}-{opt_name}-cap", cls(_mlp(rank), bucket_bytes=CAP_BYTES), opt_name)
        run(f"{name}-no_sync", cls(_mlp(rank), **({} if name == "naive" else
                                                  {"bucket_bytes": CAP_BYTES})), batches=halves)
    run("overlapped-no_sync-keep_grads", OverlappedDDP(_mlp(rank), bucket_bytes=CAP_BYTES),
        "adamw", halves, keep_grads=True)  # grads stay bucket views; no_sync adds into them
    from gpulab.distributed import ring_all_reduce

    run("overlapped-ring", OverlappedDDP(_mlp(rank), CAP_BYTES, all_reduce=ring_all_reduce))

    # Unused parameters: never used anywhere; then used only on the last rank.
    ddp = OverlappedDDP(_SideBranch(rank), bucket_bytes=CAP_BYTES)
    F.cross_entropy(ddp(x[mine]), y[mine]).backward()
    try:
        ddp.finish_gradient_sync()
        out["unused-error"] = None
    except RuntimeError as error:
        out["unused-error"] = str(error)
    ddp = run("unused-never", OverlappedDDP(_SideBranch(rank), CAP_BYTES,
                                           find_unused_parameters=True), "adamw")
    out["unused-never"]["side_grads"] = [p.grad for p in ddp.module.side.parameters()]
    side = [(x[mine], y[mine], {"use_side": rank == world_size - 1}, 1.0)]
    run("unused-last-rank", OverlappedDDP(_SideBranch(rank), CAP_BYTES,
                                          find_unused_parameters=True), "adamw", side)

    # Backward order differs between ranks: buckets must still start in the same order.
    model = _TwoBranches(rank)
    order = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _, name=name: order.append(name))
    flip = [(x[mine], y[mine], {"flip": rank % 2 == 1}, 1.0)]
    run("branch-order", OverlappedDDP(model, bucket_bytes=320), "sgd", flip)
    out["branch-order"]["hook_order"] = order[:6]  # the first step's

    # Mistakes that must be reported, not silently mis-synchronized.
    ddp = OverlappedDDP(_mlp(rank), bucket_bytes=CAP_BYTES)
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

    # A second wrapper around the same module (a notebook cell run twice) takes over the hooks.
    model = _mlp(rank)
    first = OverlappedDDP(model, CAP_BYTES)
    run("second-wrapper", OverlappedDDP(model, CAP_BYTES))
    out["second-wrapper"]["first_wrapper_filled"] = any(b.buffer.any() for b in first.buckets)

    # Each bucket's buffer on its parameters' device: a module on meta, and one half on meta.
    with _broadcast_skips_meta():
        on_meta = {name: cls(_mlp(rank).to("meta"), CAP_BYTES)
                   for name, cls in WRAPPERS.items() if name != "naive"}
        half = _mlp(rank)
        half.net[0].to("meta")  # the first layer; the rest stays on the CPU
        halves_ddp = OverlappedDDP(half, CAP_BYTES)
    out["meta-buffers"] = {name: [b.buffer.device.type for b in ddp.buckets]
                           for name, ddp in on_meta.items()}
    out["two-device-buckets"] = [({p.device.type for p in b.params}, b.buffer.device.type)
                                 for b in halves_ddp.buckets]

    if world_size == 2:  # see test_real_model_trains_like_one_process
        out["real"] = _real_model_checks(rank, world_size)

    # A group of one rank (each rank alone), and a subgroup that leaves rank 0 out.
    alone = [dist.new_group([r]) for r in range(world_size)]  # every rank calls new_group
    run("alone", OverlappedDDP(_mlp(100 + rank), CAP_BYTES, group=alone[rank]), "adamw")
    members = list(range(1, world_size))
    subgroup = dist.new_group(members)
    if rank in members:
        k = BATCH // len(members)
        part = slice((rank - 1) * k, rank * k)
        run("subgroup", BucketedDDP(_mlp(100 + rank), CAP_BYTES, group=subgroup), "adamw",
            [(x[part], y[part], {}, 1.0)])
    dist.barrier()
    return out


def _real_model_checks(rank, world_size):
    """RealModel (tests/real_model.py) under each wrapper: parameters after each step and the
    gradients' dtypes; NaiveDDP and BucketedDDP without its unused and partly used heads, and
    with them, the error they raise."""
    out = {}
    batch = real_model.rank_batch(rank, world_size)
    ddp = OverlappedDDP(real_model.RealModel(rank), find_unused_parameters=True)
    out["overlapped"] = real_model.train(ddp, real_model.adamw(ddp), [batch],
                                         ddp.finish_gradient_sync)
    out["overlapped-buckets"] = [b.buffer.dtype for b in ddp.buckets]
    for name in ("naive", "bucketed"):
        ddp = WRAPPERS[name](real_model.RealModel(rank, branches=False))
        out[name] = real_model.train(ddp, real_model.adamw(ddp),
                                     [real_model.rank_batch(rank, world_size, branches=False)],
                                     ddp.finish_gradient_sync)
        ddp = WRAPPERS[name](real_model.RealModel(rank))
        F.cross_entropy(ddp(batch[0]), batch[1]).backward()  # the same heads unused on all ranks
        try:
            ddp.finish_gradient_sync()
            out[f"{name}-error"] = None
        except RuntimeError as error:
            out[f"{name}-error"] = str(error)
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
    assert assign_buckets(params, CAP_BYTES) == [[7, 6, 5], [4], [3], [2], [1, 0]]
    assert assign_buckets(params) == [list(range(7, -1, -1))]  # 25 MB: one bucket
    assert assign_buckets(params, 0) == [[i] for i in range(7, -1, -1)]
    mixed = [torch.zeros(2), torch.zeros(2, dtype=torch.float64), torch.zeros(2)]
    assert assign_buckets(mixed) == [[2, 0], [1]], "one open bucket per dtype"
    assert assign_buckets([]) == []


def _tensors(nbytes, kinds):
    """Empty tensors of the given sizes in bytes, each of its (dtype, device) kind."""
    return [torch.empty(n // dtype.itemsize, dtype=dtype, device=device)
            for n, (dtype, device) in zip(nbytes, kinds, strict=True)]


def test_assign_buckets_keeps_one_open_bucket_per_dtype_and_device():
    nbytes = [768, 64, 512, 32, 320, 20]
    f32, bf16 = (torch.float32, "cpu"), (torch.bfloat16, "cpu")
    params = _tensors(nbytes, [f32, f32, bf16, bf16, f32, f32])
    # Last first: 5 and 4 open the fp32 bucket, 3 and 2 the bf16 one, 1 joins the fp32 one
    # (404 bytes), and 0 would take it to 1172: past 1000, so 0 opens a new fp32 bucket.
    assert assign_buckets(params, 1000) == [[5, 4, 1], [3, 2], [0]]
    assert assign_buckets(params, 1200) == [[5, 4, 1, 0], [3, 2]], "1172 bytes fit in 1200"
    # The same with the middle pair fp32 on another device: devices split buckets as dtypes do.
    meta = (torch.float32, "meta")
    params = _tensors(nbytes, [f32, f32, meta, meta, f32, f32])
    assert assign_buckets(params, 1000) == [[5, 4, 1], [3, 2], [0]]
    params = _tensors(nbytes, [f32] * 6)
    assert assign_buckets(params, 1000) == [[5, 4, 3, 2, 1], [0]], "one kind: one open bucket"


def test_bucket_buffer_lives_on_its_parameters_device():
    bucket = Bucket([torch.empty(3, 2, device="meta"), torch.empty(5, device="meta")])
    assert bucket.buffer.device.type == "meta" and bucket.buffer.shape == (11,)
    assert [slot.shape for slot in bucket.slots] == [(3, 2), (5,)]
    assert Bucket([torch.empty(4, dtype=torch.bfloat16)]).buffer.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="one dtype and device"):
        Bucket([torch.empty(2), torch.empty(2, device="meta")])
    with pytest.raises(ValueError, match="one dtype and device"):
        Bucket([torch.empty(2), torch.empty(2, dtype=torch.bfloat16)])


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


@pytest.mark.dist
def test_a_second_wrapper_on_the_same_model_takes_over(ddp_run):
    world_size, out = ddp_run
    x, y = _data()
    _assert_trains_like(world_size, out, "second-wrapper", _reference(_mlp(0), "sgd", x, y))
    assert out[0]["second-wrapper"]["stats"].all_reduce_calls == 5
    assert not any(o["second-wrapper"]["first_wrapper_filled"] for o in out), (
        "the first wrapper's hooks still ran: both wrappers would send every bucket")


@pytest.mark.dist
def test_buffers_live_on_their_parameters_device(ddp_run):
    _, out = ddp_run
    for o in out:
        for name, devices in o["meta-buffers"].items():
            assert devices and set(devices) == {"meta"}, (
                f"{name} around a meta module: buffers on {devices}; a bucket's buffer must be "
                "on its parameters' device")
        buckets = o["two-device-buckets"]
        assert all(params == {buffer} for params, buffer in buckets), buckets
        assert {buffer for _, buffer in buckets} == {"meta", "cpu"}


@pytest.mark.dist
def test_real_model_trains_like_one_process(ddp_run):
    """Frozen, unused on every rank, used on some ranks, bf16 beside fp32: as torch DDP does."""
    world_size, out = ddp_run
    if world_size != 2:
        pytest.skip("the real model runs on 2 ranks only: a mean of 3 bf16 gradients rounds "
                    "differently from one process's sum of thirds")
    for name, branches in (("overlapped", True), ("naive", False), ("bucketed", False)):
        model = real_model.RealModel(0, branches)
        want, want_grads = real_model.train(model, real_model.adamw(model),
                                            real_model.one_process_batches(world_size, branches))
        real_model.assert_trains_like([o["real"][name][0] for o in out], want, name)
        for rank, o in enumerate(out):
            assert o["real"][name][1] == want_grads, (
                f"{name}, rank {rank}: gradient dtypes {o['real'][name][1]}, one process has "
                f"{want_grads}. Frozen and unused-on-every-rank parameters keep grad None; "
                "a partly used one gets the mean; a bf16 one a bf16 gradient")
    assert out[0]["real"]["overlapped-buckets"] == [torch.float32, torch.bfloat16]


@pytest.mark.dist
@pytest.mark.parametrize("name", ["naive", "bucketed"])
def test_naive_and_bucketed_name_the_parameters_without_a_gradient(ddp_run, name):
    world_size, out = ddp_run
    if world_size != 2:
        pytest.skip("the real model runs on 2 ranks only")
    for o in out:
        message = o["real"][f"{name}-error"]
        assert message is not None, "a parameter without a gradient must be an error"
        for param in real_model.UNUSED + real_model.PARTLY:
            assert param in message
        assert "frozen." not in message and "find_unused_parameters=True" in message
