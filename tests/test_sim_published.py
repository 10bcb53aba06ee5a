"""The published kernels that benchmarks/bench_cost_model.py models (benchmarks/published_kernels
.py), counted on one block and checked against counts worked out by hand: the benchmark's
comparison with published measurements is only as good as these transcriptions."""

import sys
from pathlib import Path

import numpy as np
import pytest

from gpulab.sim import count, run_traced

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import published_kernels as pk  # noqa: E402

W = pk.W
WARPS = 32  # a block of 32 x 32 threads


def one_block(kernel):
    z = np.zeros
    return count(run_traced(kernel, (1, 1), (W, W), z(32 * W, np.float32),
                            z(32 * 32, np.float32), 32))


@pytest.fixture(scope="module")
def aat():
    return {k.__name__: one_block(k) for k in (pk.aat_simple, pk.aat_tile, pk.aat_padded_tile)}


def test_the_strided_a_transposed_read_takes_a_sector_per_thread(aat):
    c = aat["aat_simple"]
    # each of W turns: a[row * W + i] is one word for the warp (1 sector), a[col * W + i]
    # is 32 rows of A apart (32 sectors); then one coalesced store of a row of C (4 sectors)
    assert c.global_load_requests == WARPS * W * 2
    assert c.global_load_sectors == WARPS * W * (1 + 32)
    assert (c.global_store_requests, c.global_store_sectors) == (WARPS, WARPS * 4)


def test_the_unpadded_transposed_tile_is_written_down_a_column(aat):
    tile, padded = aat["aat_tile"], aat["aat_padded_tile"]
    for c in (tile, padded):  # two coalesced loads per warp, no loop over global memory
        assert (c.global_load_requests, c.global_load_sectors) == (2 * WARPS, 2 * WARPS * 4)
        assert c.shared_requests == WARPS * (2 + 2 * W)  # 2 stores, 2 reads per turn
        assert c.barriers_per_block == 1
    # transposed[tx, ty] = ...: a warp writes a column, 32 words in one bank on [32][32]
    assert tile.shared_passes == WARPS * (1 + 32 + 2 * W)
    assert tile.worst_bank_conflict == 32
    assert padded.shared_passes == WARPS * (2 + 2 * W) and padded.worst_bank_conflict == 1


def test_boehms_2d_block_tiling_reads_its_tiles_with_bank_conflicts():
    z = np.zeros
    n, k = pk.BM5, 2 * pk.BK5  # one block, two steps of BK along K
    c = count(run_traced(pk.sgemm_2d_tiles, (1, 1), 256, n, n, k, np.float32(1.0),
                         z(n * k, np.float32), z(k * n, np.float32), np.float32(0.0),
                         z(n * n, np.float32)))
    warps, steps = 256 // 32, k // pk.BK5
    # per step and warp: 4 + 4 tile stores (1 pass each); per dot (BK of them) 8 reads of the
    # A tile (two rows of threads, 64 words apart: 2 passes) and 8 of the B tile (16 threads
    # 8 words apart: 4 words in each bank they touch, 4 passes)
    assert c.shared_requests == warps * steps * (8 + pk.BK5 * 16)
    assert c.shared_passes == warps * steps * (8 + pk.BK5 * (8 * 2 + 8 * 4))
    assert c.worst_bank_conflict == 4
    assert c.barriers_per_block == 2 * steps
