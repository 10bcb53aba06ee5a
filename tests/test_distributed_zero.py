"""ZeRO-1 against single-process AdamW on 2 and 3 real gloo ranks (and, on 2, with torch DDP's
rules for frozen, unused and partly used parameters and bf16: tests/real_model.py), the ZeRO
paper's memory table, and DDP / ZeRO-1 / FSDP2 side by side.

A launch costs a few seconds, so each world size is launched once (a module-scoped fixture)
and several tests read what it returned.
"""

import functools

import pytest
import real_model
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gpulab.distributed import run_on_ranks
from gpulab.distributed.zero import (
    STRATEGIES,
    MemoryRow,
    ZeroOneOptimizer,
    compare_strategies,
    format_memory_table,
    memory_per_rank,
    optimizer_state_bytes,
    partition_parameters,
    zero_memory_table,
)

STEPS = 4
BATCH = 12  # divides by 2 and by 3: every rank gets an equal slice
LR = 0.05


# ---- partitioning, pure -------------------------------------------------------------------

@pytest.mark.parametrize("numels, world_size", [
    ([35, 5, 15, 3, 3, 1], 2), ([35, 5, 15, 3, 3, 1], 3), ([4096, 64, 64, 1024, 16], 4),
    ([7] * 9, 4), ([10, 1], 5), ([1], 1), ([], 3)])
def test_partition_covers_every_parameter_once_and_balances(numels, world_size):
    shards = partition_parameters(numels, world_size)
    assert len(shards) == world_size
    owned = sorted(i for shard in shards for i in shard)
    assert owned == list(range(len(numels))), f"every parameter exactly once, got {shards}"
    assert all(shard == sorted(shard) for shard in shards)
    loads = [sum(numels[i] for i in shard) for shard in shards]
    # greedy largest-first: no rank is ahead of another by more than the largest parameter
    assert max(loads) - min(loads) <= max(numels, default=0)
    assert partition_parameters(list(numels), world_size) == shards  # the same on every rank


def test_partition_by_hand():
    assert partition_parameters([35, 5, 15, 3, 3, 1], 3) == [[0], [2], [1, 3, 4, 5]]
    assert partition_parameters([10, 1], 5) == [[0], [1], [], [], []]  # more ranks than params
    with pytest.raises(ValueError, match="world_size"):
        partition_parameters([1], 0)


# ---- the memory table, pure ---------------------------------------------------------------

# Rajbhandari et al. 2020, Table 1 (Figure 1 is its Nd=64 row): a 7.5B-parameter model with
# mixed-precision Adam (K=12), GB per GPU for P_os, P_os+g, P_os+g+p; the baseline is 120 GB.
PAPER_7_5B = {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5),
              64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)}


@pytest.mark.parametrize("world_size", sorted(PAPER_7_5B))
def test_zero_memory_table_reproduces_the_paper(world_size):
    rows = zero_memory_table(7_500_000_000, world_size)
    assert [r.strategy for r in rows] == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert rows[0].total_bytes == 120e9  # (2 + 2 + 12) bytes x 7.5B, on every rank
    got = [r.total_bytes / 1e9 for r in rows[1:]]
    # the paper rounds to 3 significant figures (and rounds 41.25 up)
    assert got == pytest.approx(PAPER_7_5B[world_size], abs=0.051), (
        f"Nd={world_size}: {got} GB per rank, the paper says {PAPER_7_5B[world_size]}")


def test_zero_memory_table_shards_what_each_stage_says():
    ddp, z1, z2, z3 = zero_memory_table(1000, 8, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert (ddp.param_bytes, ddp.grad_bytes, ddp.optimizer_state_bytes) == (4000, 4000, 8000)
    assert (z1.param_bytes, z1.grad_bytes, z1.optimizer_state_bytes) == (4000, 4000, 1000)
    assert (z2.param_bytes, z2.grad_bytes, z2.optimizer_state_bytes) == (4000, 500, 1000)
    assert (z3.param_bytes, z3.grad_bytes, z3.optimizer_state_bytes) == (500, 500, 1000)
    assert zero_memory_table(10, 3)[3].param_bytes == 7  # 20 bytes over 3 ranks: round up


def test_format_memory_table_prints_the_papers_figure():
    text = format_memory_table(zero_memory_table(7_500_000_000, 64))
    assert text.splitlines()[0].split() == ["strategy", "rank", "params", "GB", "grads", "GB",
                                            "optimizer", "GB", "total", "GB"]
    totals = [line.split()[-1] for line in text.splitlines()[1:]]
    assert totals == ["120", "31.4", "16.6", "1.88"], text
    small = format_memory_table([MemoryRow("DDP", 0, 400, 400, 1600)])
    assert "KB" in small and small.splitlines()[1].split() == ["DDP", "0", "0.4", "0.4",
                                                               "1.6", "2.4"]


# ---- ZeRO-1 on real ranks -----------------------------------------------------------------

def _odd_model():
    """Layers of odd sizes: 35, 5, 15, 3, 3 and 1 elements, so shards cannot be even."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 1))


def _param_groups(model):
    """Weight decay on matrices only, as people train: two param groups."""
    return [{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay": 0.0}]


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _train(model, opt, x, y, steps, reduce=None):
    """`steps` AdamW steps on (x, y); the flat parameters after each step."""
    history = []
    for _ in range(steps):
        F.mse_loss(model(x), y).backward()
        if reduce is not None:
            reduce()
        opt.step()
        opt.zero_grad()
        history.append(_flat(model))
    return history


def _zero_checks(rank, world_size):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 1, generator=g)
    part = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
    out = {}

    ref = _odd_model()  # one process, the whole batch
    ref_opt = torch.optim.AdamW(_param_groups(ref), lr=LR)
    out["reference"] = _train(ref, ref_opt, x, y, STEPS)
    out["reference_state_bytes"] = optimizer_state_bytes(ref_opt)

    model = _odd_model()
    opt = ZeroOneOptimizer(_param_groups(model), torch.optim.AdamW, lr=LR)
    out["zero"] = _train(model, opt, x[part], y[part], STEPS, reduce=opt.reduce_gradients)
    index = {id(p): i for i, p in enumerate(opt.params)}
    out["numels"] = [p.numel() for p in opt.params]
    out["partition"] = opt.partition
    out["owned"] = sorted(index[id(p)] for p in opt.owned_params)
    out["state_params"] = sorted(index[id(p)] for p in opt.optimizer.state)
    out["state_bytes"] = optimizer_state_bytes(opt)
    out["memory"] = memory_per_rank("ZeRO-1", model.parameters(), opt)
    out["repr"] = repr(opt)
    with pytest.raises(NotImplementedError) as error:
        opt.state_dict()
    out["state_dict_error"] = str(error.value)
    # A known-wrong ZeRO-1: the shard update without the broadcast. Ranks must drift apart.
    F.mse_loss(model(x[part]), y[part]).backward()
    opt.reduce_gradients()
    opt.optimizer.step()
    out["no_broadcast"] = _flat(model)

    # Gradients reduced to their owners only (ZeRO-2's communication).
    model = _odd_model()
    opt = ZeroOneOptimizer(_param_groups(model), torch.optim.AdamW, lr=LR)
    F.mse_loss(model(x[part]), y[part]).backward()
    opt.reduce_gradients(owners_only=True)
    out["grads_kept"] = [i for i, p in enumerate(opt.params) if p.grad is not None]
    opt.step()
    opt.zero_grad()
    out["owners_only"] = [_flat(model)] + _train(
        model, opt, x[part], y[part], STEPS - 1, reduce=lambda: opt.reduce_gradients(True))

    # One parameter tensor, more ranks than parameters: ranks 1.. own nothing and still follow.
    torch.manual_seed(2)
    tiny_ref, tiny = nn.Linear(7, 1, bias=False), nn.Linear(7, 1, bias=False)
    tiny.load_state_dict(tiny_ref.state_dict())
    out["tiny_reference"] = _train(tiny_ref, torch.optim.AdamW(tiny_ref.parameters(), lr=LR),
                                   x, y, STEPS)
    opt = ZeroOneOptimizer(tiny.parameters(), torch.optim.AdamW, lr=LR)  # a generator
    out["tiny_has_optimizer"] = opt.optimizer is not None
    out["tiny_state_bytes"] = optimizer_state_bytes(opt)
    out["tiny"] = _train(tiny, opt, x[part], y[part], STEPS, reduce=opt.reduce_gradients)

    # Frozen, unused and partly used parameters, bf16 beside fp32 (on 2 ranks: see
    # test_zero_one_follows_torch_ddp_rules), gradients reduced to all ranks or to owners only.
    if world_size == 2:
        for key, owners_only in (("real", False), ("real-owners_only", True)):
            model = real_model.RealModel(0)  # no broadcast in ZeRO-1: the same seed everywhere
            opt = ZeroOneOptimizer(model.parameters(), torch.optim.AdamW, **real_model.ADAMW)
            out[key] = real_model.train(
                model, opt, [real_model.rank_batch(rank, world_size)],
                functools.partial(opt.reduce_gradients, owners_only=owners_only))
            names = [name for name, _ in model.named_parameters()]
            out[key + "-owned"] = [names[i] for i in opt.partition[rank]]

    # A process group of ranks {0, last}: group ranks differ from global ranks on 3 ranks.
    members = [0, world_size - 1]
    group = dist.new_group(members)  # every rank must call new_group
    if rank in members:
        half = slice(0, BATCH // 2) if rank == 0 else slice(BATCH // 2, BATCH)
        model = _odd_model()
        opt = ZeroOneOptimizer(_param_groups(model), torch.optim.AdamW, group=group, lr=LR)
        out["subgroup"] = _train(model, opt, x[half], y[half], STEPS,
                                 reduce=opt.reduce_gradients)
    dist.barrier()
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def zero_run(request):
    return request.param, run_on_ranks(_zero_checks, request.param, timeout_s=90, backend="gloo")


@pytest.mark.dist
def test_zero_one_matches_single_process_adamw_on_every_rank(zero_run):
    world_size, out = zero_run
    for step in range(STEPS):
        for rank in range(1, world_size):
            assert torch.equal(out[rank]["zero"][step], out[0]["zero"][step]), (
                f"step {step}: rank {rank}'s parameters differ from rank 0's; after step() "
                "every shard must be broadcast from its owner")
        torch.testing.assert_close(out[0]["zero"][step], out[0]["reference"][step],
                                   rtol=1e-5, atol=1e-6,
                                   msg=lambda m, s=step: f"step {s}: ZeRO-1 != AdamW. {m}")
        torch.testing.assert_close(out[0]["owners_only"][step], out[0]["zero"][step],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[0]["subgroup"][step], out[0]["reference"][step],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[world_size - 1]["subgroup"][step],
                                   out[0]["subgroup"][step], rtol=0, atol=0)
    # the known-wrong variant (no broadcast) is caught by the same comparison
    assert not torch.equal(out[0]["no_broadcast"], out[1]["no_broadcast"])


@pytest.mark.dist
def test_zero_one_state_lives_only_on_the_owner(zero_run):
    world_size, out = zero_run
    numels = out[0]["numels"]
    assert [o["partition"] for o in out] == [partition_parameters(numels, world_size)] * \
        world_size, "every rank must compute the same partition"
    owned = [o["owned"] for o in out]
    assert owned == out[0]["partition"]
    assert sorted(i for shard in owned for i in shard) == list(range(len(numels)))
    for rank, o in enumerate(out):
        assert o["state_params"] == o["owned"], f"rank {rank} keeps state for others' params"
        # AdamW: exp_avg and exp_avg_sq (fp32, like the parameter) and a 4-byte step each
        assert o["state_bytes"] == sum(8 * numels[i] + 4 for i in o["owned"])
        assert o["grads_kept"] == o["owned"], "owners_only keeps the owner's gradients only"
        assert o["memory"] == out[0]["memory"], "memory_per_rank: the same list on every rank"
        row = o["memory"][rank]
        assert (row.strategy, row.rank, row.optimizer_state_bytes) == ("ZeRO-1", rank,
                                                                       o["state_bytes"])
        assert row.param_bytes == 4 * sum(numels)
        assert f"rank {rank} of {world_size}" in o["repr"]
        assert "opt.optimizer.state_dict()" in o["state_dict_error"]
    assert sum(o["state_bytes"] for o in out) == out[0]["reference_state_bytes"], (
        "the shards' optimizer state adds up to exactly one unsharded AdamW's")


@pytest.mark.dist
def test_zero_one_with_ranks_that_own_nothing(zero_run):
    world_size, out = zero_run
    assert [o["tiny_has_optimizer"] for o in out] == [True] + [False] * (world_size - 1)
    assert [o["tiny_state_bytes"] for o in out][1:] == [0] * (world_size - 1)
    for o in out:
        for got, want in zip(o["tiny"], out[0]["tiny_reference"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ---- DDP, ZeRO-1 and FSDP2 side by side ----------------------------------------------------

@pytest.mark.dist
def test_compare_strategies_losses_match_and_fsdp2_holds_a_shard():
    world_size = 3
    result = compare_strategies(world_size=world_size, steps=3, batch_size=12)
    assert list(result.losses) == list(STRATEGIES)
    for strategy in STRATEGIES[1:]:
        assert result.losses[strategy] == pytest.approx(result.losses["DDP"], rel=1e-5), (
            f"{strategy} must train exactly as DDP does: {result.losses}")
    assert result.losses["DDP"][-1] < result.losses["DDP"][0]  # it does train
    rows = {(r.strategy, r.rank): r for r in result.memory}
    assert len(rows) == len(result.memory) == 3 * world_size
    full = 4 * result.n_params  # fp32
    for rank in range(world_size):
        ddp, zero, fsdp = (rows[s, rank] for s in STRATEGIES)
        assert ddp.param_bytes == ddp.grad_bytes == zero.param_bytes == zero.grad_bytes == full
        assert ddp.optimizer_state_bytes == 2 * full + 4 * 6  # exp_avg, exp_avg_sq, 6 steps
        assert 0.8 < fsdp.param_bytes / (full / world_size) < 1.2, "FSDP2: about 1/world_size"
        assert fsdp.grad_bytes == fsdp.param_bytes
    zero_state = sum(rows["ZeRO-1", r].optimizer_state_bytes for r in range(world_size))
    assert zero_state == rows["DDP", 0].optimizer_state_bytes, "ZeRO-1's shards add up"
    # FSDP2 shards exp_avg and exp_avg_sq; every rank keeps its own 4-byte step per parameter
    fsdp_state = sum(rows["FSDP2", r].optimizer_state_bytes - 4 * 6 for r in range(world_size))
    assert fsdp_state == 2 * full, "FSDP2's shards of the state add up"
    assert sum(rows["FSDP2", r].param_bytes for r in range(world_size)) == full
    text = str(result)
    assert "FSDP2" in text and "ZeRO-1" in text and f"{result.n_params:,} parameters" in text


@pytest.mark.dist
def test_zero_one_follows_torch_ddp_rules(zero_run):
    """A parameter only rank 0 has a gradient for must still be reduced on every rank (the ranks
    issued different all-reduces before: wrong pairs or a hang); frozen and unused-everywhere
    ones keep grad None, so AdamW skips them; bf16 beside fp32."""
    world_size, out = zero_run
    if world_size != 2:
        pytest.skip("the real model runs on 2 ranks only: a mean of 3 bf16 gradients rounds "
                    "differently from one process's sum of thirds")
    model = real_model.RealModel(0)
    want, want_grads = real_model.train(model, real_model.adamw(model),
                                        real_model.one_process_batches(world_size))
    for key in ("real", "real-owners_only"):
        real_model.assert_trains_like([o[key][0] for o in out], want, f"ZeRO-1 {key}")
    for rank, o in enumerate(out):
        assert o["real"][1] == want_grads, f"rank {rank}: gradients {o['real'][1]}"
        # owners_only: the owner keeps the mean (or None, as above); the others drop it
        kept = {name: dtype for name, dtype in o["real-owners_only"][1].items() if dtype}
        assert kept == {name: want_grads[name] for name in o["real-owners_only-owned"]
                        if want_grads[name]}, f"rank {rank}: owners_only kept {kept}"
