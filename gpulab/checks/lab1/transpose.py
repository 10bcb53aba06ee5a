"""Lab 1, Part 3: a transpose through a shared-memory tile with no padding (check_transpose, and
check_transpose_technique: coalesced loads and stores, no bank conflicts, a tile of exactly
TILE_DIM x TILE_DIM floats).

Lesson 02's transpose_kernel_v3 avoids bank conflicts with a padding column, (TILE, TILE + 1);
this part allows no padding, so the tile's layout itself must spread a column over the 32 banks
(a skewed or swizzled layout). Retyped, the lesson's kernel keeps its values and loses the
technique.
Taught in: lessons/02_cuda_with_numba.ipynb (section "Coalescing and bank conflicts")
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpulab.checks.harness.kernels import GuardedOutput, bad_indices, launch
from gpulab.checks.harness.owned import require_own_kernel
from gpulab.checks.harness.technique import Yardstick, judge_technique, trace_kernel
from gpulab.checks.lab1.config import BLOCK_ROWS, TILE_DIM
from gpulab.kernels.common import ceil_div

THREADS = (TILE_DIM, BLOCK_ROWS)  # (x, y): a block copies a TILE_DIM x TILE_DIM tile
HINT = 'gpulab.hint("lab1", "transpose")'


def transpose_blocks(rows: int, cols: int) -> tuple[int, int]:
    """The grid over a of shape (rows, cols): a block per TILE_DIM x TILE_DIM tile, x along
    a's columns."""
    return ceil_div(cols, TILE_DIM), ceil_div(rows, TILE_DIM)


def check_transpose(kernel, shapes=((8, 24), (13, 21)), seed=0):
    """transpose(out, a): out[c, r] = a[r, c] for a of shape (R, C); blocks of (TILE_DIM,
    BLOCK_ROWS) threads, one per TILE_DIM x TILE_DIM tile of a, x along a's columns."""
    require_own_kernel(kernel, "transpose")
    rng = np.random.default_rng(seed)
    for rows, cols in shapes:
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        case = f"a of shape ({rows}, {cols}), out of shape ({cols}, {rows})"
        out = GuardedOutput((cols, rows), np.float32, np.nan)
        want = a.T.astype(np.float64)
        launch(kernel, "transpose", transpose_blocks(rows, cols), THREADS, out.view,
               cuda.to_device(a), case=case)
        got = out.result("transpose", case)
        bad = bad_indices(got, want, rtol=0, atol=0)
        if bad.size == 0:
            continue
        unwritten = np.isnan(got)
        # A value in the wrong place names a layout mistake better than a NaN does: a NaN may
        # also be copied from a tile cell no thread wrote (shared memory starts as garbage).
        misplaced = bad[~unwritten[bad[:, 0], bad[:, 1]]]
        c, r = (int(v) for v in (misplaced[0] if misplaced.size else bad[0]))
        past_block_rows = np.arange(cols) % TILE_DIM >= BLOCK_ROWS  # out's rows, by tile row
        if unwritten.all():
            hint = ("Nothing was written. Load the tile from a, cuda.syncthreads(), then write "
                    "out from the tile.")
        elif past_block_rows.any() and unwritten[past_block_rows].all():
            hint = (f"Only the first {BLOCK_ROWS} rows of each tile were written: a block has "
                    f"{BLOCK_ROWS} rows of threads for a tile of {TILE_DIM}, so each thread "
                    f"copies {TILE_DIM // BLOCK_ROWS} rows, when loading and when storing.")
        elif np.isnan(got[c, r]):
            hint = ("It was never written. The tile at block (bx, by) of a lands at block "
                    "(by, bx) of out: the block indices swap, not only the thread indices. "
                    "Guard each access by the shape of the array it reads or writes.")
        elif rows * cols > 1 and np.array_equal(got, a.reshape(cols, rows)):
            hint = ("out holds a's elements in a's own order (a reshape, not a transpose): "
                    "a row of out is a column of the tile.")
        else:
            hint = ("Within a tile the elements are in the wrong places: a thread writes to "
                    "out's row the tile's column, and if the tile's layout is rearranged "
                    "(skewed, swizzled), it reads each element from where it was written.")
        raise AssertionError(
            f"{hint} (transpose, {case}: out[{c}, {r}] is {got[c, r]:.5f}, expected a[{r}, {c}] "
            f"= {want[c, r]:.5f}; {len(bad)} of {got.size} elements are wrong. More: {HINT}.)")


# ----------------------------------------------------------------------------- technique

TECHNIQUE_SHAPE = (TILE_DIM, 2 * TILE_DIM)  # two whole tiles: every warp request is a full one
COALESCED = (TILE_DIM * 4) // 32  # sectors a warp's 32 consecutive float32 take: 4
TILE_BYTES = TILE_DIM * TILE_DIM * 4  # the most shared memory a block may declare: no padding
SPEED_SHAPE = (4096, 4096)  # the gpu runner's timing, printed and not graded


@cuda.jit
def _plain_transpose(out, a):
    """What the gpu runner times transpose against: the same grid, straight from a to out
    (the stores of a warp land a row of out apart)."""
    x = cuda.blockIdx.x * TILE_DIM + cuda.threadIdx.x
    y = cuda.blockIdx.y * TILE_DIM + cuda.threadIdx.y
    for j in range(0, TILE_DIM, BLOCK_ROWS):
        if y + j < a.shape[0] and x < a.shape[1]:
            out[x, y + j] = a[y + j, x]


def check_transpose_technique(kernel, shape=TECHNIQUE_SHAPE, seed=0):
    """Coalesced, through an unpadded tile without bank conflicts, judged on the simulator's
    trace on both runners (technique_verdict); the gpu runner prints the measured speed."""
    require_own_kernel(kernel, "transpose")
    judge_technique(technique_verdict, kernel, {"shape": tuple(shape), "seed": seed},
                    _yardstick)


def technique_verdict(kernel, shape=TECHNIQUE_SHAPE, seed=0):
    """At most COALESCED sectors per warp request of a and of out, at most TILE_BYTES of shared
    memory per block, and no shared-memory request that takes more than one pass
    (count(trace).worst_bank_conflict)."""
    from gpulab.sim.cost import count

    rows, cols = shape
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    case = f"a of shape ({rows}, {cols})"
    trace = trace_kernel(kernel, "transpose", transpose_blocks(rows, cols), THREADS,
                         np.zeros((cols, rows), np.float32), a, case=case)
    counters = count(trace)
    values_right = "The values are right; this is the technique's part."
    for what, name, requests, sectors in (
            ("loads", "a", counters.global_load_requests, counters.global_load_sectors),
            ("stores", "out", counters.global_store_requests, counters.global_store_sectors)):
        per_request = sectors / max(requests, 1)
        if per_request > COALESCED + 0.5:
            raise AssertionError(
                f"Stage the tile in shared memory, so that both a's rows and out's rows are "
                f"copied by consecutive threads: transpose ({case}) {what} `{name}` with "
                f"{per_request:.1f} sectors of 32 B per warp request, where coalesced {what} "
                f"take {COALESCED}. The 32 threads of a warp each touch an element a whole row "
                f"of `{name}` apart, so every element costs a sector of its own. " + values_right
                + f" More: {HINT}.")
    if counters.shared_bytes_per_block > TILE_BYTES:
        raise AssertionError(
            f"Keep the tile at TILE_DIM x TILE_DIM floats, no padding: transpose ({case}) "
            f"declares {counters.shared_bytes_per_block} B of shared memory per block, and this "
            f"part allows {TILE_BYTES} B. Padding is lesson 02's fix; here the tile's layout "
            f"must spread a column over the 32 banks instead. {values_right} More: {HINT}.")
    if counters.worst_bank_conflict > 1:
        raise AssertionError(
            f"Lay the tile out so that a column spans all 32 banks: in transpose ({case}) one "
            f"warp's access to the tile took {counters.worst_bank_conflict} passes (a "
            f"{counters.worst_bank_conflict}-way bank conflict). Word w of shared memory sits "
            f"in bank w % 32, and the {TILE_DIM} words of a column of a row-major "
            f"{TILE_DIM}-wide float32 tile all sit in one bank. {values_right} More: {HINT}.")


def _yardstick() -> Yardstick:
    rows, cols = SPEED_SHAPE
    a = np.random.default_rng(0).standard_normal(SPEED_SHAPE).astype(np.float32)
    return Yardstick(_plain_transpose, "a plain transpose (stores a row of out apart)",
                     f"{rows} x {cols}", transpose_blocks(rows, cols), THREADS,
                     lambda: (cuda.device_array((cols, rows), np.float32), cuda.to_device(a)))
