"""Collectives: the pure simulation against real gloo runs, ring and tree all-reduce against
dist.all_reduce, the pictures, and the alpha-beta cost model worked by hand."""

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gpulab.distributed import allreduce, run_on_ranks
from gpulab.distributed import cost_model as cm
from gpulab.distributed.allreduce import ring_all_reduce, tree_all_reduce
from gpulab.distributed.collectives import (
    COLLECTIVES,
    Piece,
    collective_states,
    draw_collective,
    draw_ring,
    real_states,
    ring_steps,
    run_collective,
    simulate,
)

SIZES = (0, 1, 2, 3, 5, 7, 13, 1001)  # empty, fewer elements than ranks, odd, not divisible


# ---- the simulation, by hand -----------------------------------------------------------------

def test_simulate_by_hand_on_three_ranks():
    # rank r holds [10r, 10r+1, 10r+2]; one element per chunk
    before = [[10 * r + j for j in range(3)] for r in range(3)]
    assert simulate("all_reduce", before) == [[30, 33, 36]] * 3
    assert simulate("reduce_scatter", before) == [[30, None, None], [None, 33, None],
                                                  [None, None, 36]]
    assert simulate("all_to_all", before) == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert simulate("broadcast", before, root=2) == [[20, 21, 22]] * 3
    assert simulate("reduce", before, root=1) == [[None] * 3, [30, 33, 36], [None] * 3]
    scattered = simulate("scatter", before, root=1)
    assert scattered == [[10, None, None], [None, 11, None], [None, None, 12]]
    gathered = simulate("gather", scattered, root=0)
    assert gathered[0] == [10, 11, 12] and gathered[2] == [None, None, 12]
    assert simulate("all_gather", scattered) == [[10, 11, 12]] * 3
    with pytest.raises(ValueError, match="unknown collective"):
        simulate("all_sum", before)


def test_pieces_label_partial_and_full_sums():
    assert Piece({(1, 2)}).label(4) == "b2"
    assert (Piece({(0, 0)}) + Piece({(2, 0)})).label(4) == "a0+c0"
    assert Piece({(r, 3) for r in range(4)}).label(4) == "Σ3"


def test_ring_schedule_leaves_each_rank_one_full_chunk_then_all():
    p = 4
    steps = ring_steps(p)
    assert len(steps) == 1 + 2 * (p - 1)
    full = [Piece({(r, j) for r in range(p)}) for j in range(p)]
    _, after_reduce_scatter = steps[p - 1]
    for rank in range(p):  # rank r holds the full sum of chunk (r + 1) % p, as documented
        assert after_reduce_scatter[rank][(rank + 1) % p] == full[(rank + 1) % p]
    assert steps[-1][1] == [full] * p


# ---- the simulation against real gloo --------------------------------------------------------

def test_picture_data_equals_real_collectives():
    # One launch, eight collectives, root 1: every (rank, slot) is a power of two, so the real
    # result decodes into exactly which inputs were summed where.
    real = real_states(COLLECTIVES, world_size=4, root=1)
    for name in COLLECTIVES:
        before, after = real[name]
        assert after == simulate(name, before, root=1), f"{name}: simulation != gloo"
        assert (before, after) == collective_states(name, 4, root=1)


def _on_three_ranks(rank, world_size):
    """Random numeric chunks of 3 through every real collective, and both all-reduces on the
    default group of an odd world size."""
    rng = np.random.default_rng(0)
    before = rng.standard_normal((world_size, world_size * 3)).tolist()  # same on every rank
    collectives = {name: run_collective(name, list(before[rank]), root=2)
                   for name in COLLECTIVES}
    mine = torch.tensor(before[rank])
    want = mine.clone()
    dist.all_reduce(want)
    # gloo before recent torch releases has no all-to-all: the scatter fallback must agree.
    native, dist.all_to_all = dist.all_to_all, _gloo_without_all_to_all
    try:
        collectives["all_to_all (scatters)"] = run_collective("all_to_all", list(before[rank]))
    finally:
        dist.all_to_all = native
    return before, collectives, want, ring_all_reduce(mine.clone()), tree_all_reduce(mine.clone())


def _gloo_without_all_to_all(*args, **kwargs):
    raise RuntimeError("Backend gloo does not support alltoall")


def test_real_collectives_follow_the_simulation_on_numbers():
    per_rank = run_on_ranks(_on_three_ranks, 3, timeout_s=60, backend="gloo")
    before = per_rank[0][0]
    for name in COLLECTIVES:
        want = simulate(name, [[float(v) for v in row] for row in before], root=2)
        for rank in range(3):
            got = per_rank[rank][1][name]
            assert [v is None for v in got] == [v is None for v in want[rank]], name
            np.testing.assert_allclose([v for v in got if v is not None],
                                       [v for v in want[rank] if v is not None], rtol=1e-12,
                                       err_msg=f"{name} on rank {rank}")
    for rank in range(3):
        assert per_rank[rank][1]["all_to_all (scatters)"] == per_rank[rank][1]["all_to_all"]
    for rank, (_, _, want, ring, tree) in enumerate(per_rank):
        torch.testing.assert_close(ring, want, msg=f"ring all-reduce, rank {rank} of 3")
        torch.testing.assert_close(tree, want, msg=f"tree all-reduce, rank {rank} of 3")


# ---- ring and tree all-reduce against dist.all_reduce ----------------------------------------

def _all_reduce_variants(rank, world_size):
    """Ring and tree on groups of 1, 2, 3 and 4 ranks, for awkward sizes and layouts; the ring
    also with 3-element segments, so that long exchanges are pipelined in uneven pieces."""
    mismatches = []
    cases = [(size, allreduce.SEGMENT) for size in SIZES] + [(1001, 3)]
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    for n, group in groups.items():
        if rank >= n:
            continue
        for size, segment in cases:
            allreduce.SEGMENT = segment
            gen = torch.Generator().manual_seed(1000 * n + size + rank)
            # Integers in float32: every summation order gives the same bits.
            x = torch.randint(-100, 100, (size,), generator=gen).float()
            want = x.clone()
            dist.all_reduce(want, group=group)
            for name, fn in (("ring", ring_all_reduce), ("tree", tree_all_reduce)):
                got = x.clone()
                returned = fn(got, group=group)
                if returned is not got or not torch.equal(got, want):
                    mismatches.append((name, n, size, f"segment {segment}"))
        # A non-contiguous 2-D tensor (a transpose), reduced in place.
        base = torch.arange(35.0).reshape(5, 7) * (rank + 1)
        want = base.t().contiguous()
        dist.all_reduce(want, group=group)
        for name, fn in (("ring", ring_all_reduce), ("tree", tree_all_reduce)):
            view = base.clone().t()
            fn(view, group=group)
            if not torch.equal(view, want):
                mismatches.append((name, n, "5x7 transposed"))
    return mismatches


def test_ring_and_tree_equal_dist_all_reduce_for_every_size_and_world_size():
    per_rank = run_on_ranks(_all_reduce_variants, 4, timeout_s=60, backend="gloo")
    for rank, mismatches in enumerate(per_rank):
        assert not mismatches, (
            f"rank {rank}: (algorithm, world size, size, segment) differing from "
            f"dist.all_reduce: "
            f"{mismatches}. Sizes below the world size leave some chunks empty; sizes not "
            "divisible by it make the chunks unequal.")


# ---- pictures ---------------------------------------------------------------------------------

def test_pictures_have_a_panel_per_state_and_label_the_data():
    fig = draw_collective("all_to_all", world_size=3)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["before", "after all_to_all"]
    after = sorted(t.get_text() for t in axes[1].texts)
    assert after == sorted(f"{'abc'[r]}{j}" for r in range(3) for j in range(3))
    ring = draw_ring(3)
    assert len([ax for ax in ring.axes if ax.get_visible()]) == 1 + 2 * 2
    assert {t.get_text() for t in ring.axes[4].texts} == {"Σ0", "Σ1", "Σ2"}


# ---- the alpha-beta cost model, by hand -------------------------------------------------------

ALPHA, BETA, N = 1e-5, 1e9, 1e6  # 10 us per message, 1 GB/s, 1 MB


def test_cost_model_formulas_by_hand():
    assert cm.ring_all_reduce_time(N, 4, ALPHA, BETA) == pytest.approx(6 * 1e-5 + 1.5 * 1e-3)
    assert cm.tree_all_reduce_time(N, 4, ALPHA, BETA) == pytest.approx(4 * (1e-5 + 1e-3))
    assert cm.tree_all_reduce_time(N, 5, ALPHA, BETA) == pytest.approx(6 * (1e-5 + 1e-3))
    assert cm.all_gather_time(N, 4, ALPHA, BETA) == pytest.approx(3e-5 + 0.75e-3)
    assert cm.reduce_scatter_time(N, 8, ALPHA, BETA) == pytest.approx(7e-5 + 0.875e-3)
    assert cm.broadcast_time(N, 8, ALPHA, BETA) == pytest.approx(3 * (1e-5 + 1e-3))
    assert cm.ring_all_reduce_time(N, 1, ALPHA, BETA) == 0.0
    # The ring's bandwidth term approaches 2n/beta; the tree's grows with log2 p.
    assert cm.ring_all_reduce_time(N, 1024, 0, BETA) < 2 * N / BETA
    assert cm.tree_all_reduce_time(N, 1024, 0, BETA) == pytest.approx(20 * N / BETA)
    with pytest.raises(ValueError, match="no model"):
        cm.collective_time("all_reduce", N, 4, ALPHA, BETA, algorithm="butterfly")


def test_bandwidths_as_nccl_tests_reports_them():
    assert cm.algbw(2e9, 0.5) == pytest.approx(4.0)
    assert cm.busbw("all_reduce", 4.0, 8) == pytest.approx(4.0 * 2 * 7 / 8)
    assert cm.busbw("all_gather", 4.0, 8) == pytest.approx(3.5)
    assert cm.busbw("reduce_scatter", 4.0, 4) == pytest.approx(3.0)
    assert cm.busbw("all_to_all", 4.0, 2) == pytest.approx(2.0)
    assert cm.busbw("broadcast", 4.0, 8) == cm.busbw("reduce", 4.0, 8) == 4.0


def test_fit_recovers_alpha_and_beta():
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    exact = cm.ring_all_reduce_time(sizes, 4, ALPHA, BETA)
    fit = cm.fit_alpha_beta(sizes, exact, 4)
    assert fit.alpha == pytest.approx(ALPHA) and fit.beta == pytest.approx(BETA)
    assert fit.rms_error == pytest.approx(0.0, abs=1e-12)
    noisy = exact * np.array([1.03, 0.98, 1.01, 0.99, 1.02])
    fit = cm.fit_alpha_beta(sizes, noisy, 4)
    assert fit.beta == pytest.approx(BETA, rel=0.05)
    np.testing.assert_allclose(fit.predict(sizes), noisy, rtol=0.1)
    # Noise that would make alpha negative: alpha is clamped to 0, beta refitted.
    clamped = cm.fit_alpha_beta([1e6, 2e6], [0.9e-3, 2.0e-3], 2)
    assert clamped.alpha == 0.0 and math.isfinite(clamped.beta)
    with pytest.raises(ValueError, match="two or more different sizes"):
        cm.fit_alpha_beta([1e6, 1e6], [1.0, 1.0], 4)
    with pytest.raises(ValueError, match="do not grow"):
        cm.fit_alpha_beta([1e3, 1e6], [2.0, 1.0], 4)
