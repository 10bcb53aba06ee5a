"""Pictures of a trace: which blocks and threads touched which cells, and bytes per kernel.

    trace.draw_access("c", by="block")                    # who wrote each cell of C
    trace.draw_access("a", kind="read", by="count")       # how often each cell of A was read
    trace.draw_access("c", per_block=True)                # one panel per block, cells by thread
    draw_traffic({"naive": t1, "tiled": t2})              # global bytes read/written per kernel
    print(traffic_table({"naive": t1, "tiled": t2}))      # the same as text

matplotlib is imported only when something is drawn; touch_grid and traffic_table need NumPy
only. Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

import numpy as np

from gpulab.sim.memory import KIND_NAMES
from gpulab.sim.records import format_coord

BY_CHOICES = ("block", "thread", "count", "threads")
ANNOTATE_MAX_CELLS = 256  # write the id into each cell when the grid is this small


def touch_grid(trace, name: str, kind: str | None = None, by: str = "block",
               block=None) -> np.ndarray:
    """One number per element of array `name`, in its shape (int64):

    by="block"    linear id of the first block that touched the element (-1: none)
    by="thread"   linear id, within its block, of the first thread that touched it (-1: none)
    by="count"    how many accesses touched it
    by="threads"  how many different threads (of any block) touched it
    kind limits it to "read", "write" or "atomic" accesses; block to one block's accesses
    (a coordinate tuple as in Access.block, or a linear id). Linear ids count x fastest.
    """
    if by not in BY_CHOICES:
        raise ValueError(f"by={by!r}: choose one of {', '.join(BY_CHOICES)}")
    info = trace.array(name)
    aid = trace.arrays.index(info)
    k = None if kind is None else KIND_NAMES.index(kind)
    only = _block_lin(trace, block)
    size = int(np.prod(info.shape))
    grid = np.zeros(size, np.int64) if by in ("count", "threads") else np.full(size, -1, np.int64)
    seen = set()
    for blk, thr, a, flat, knd, *_ in trace.records:
        if a != aid or (k is not None and knd != k) or (only is not None and blk != only):
            continue
        if by == "count":
            grid[flat] += 1
        elif by == "threads":
            if (flat, blk, thr) not in seen:
                seen.add((flat, blk, thr))
                grid[flat] += 1
        elif grid[flat] < 0:
            grid[flat] = blk if by == "block" else thr
    return grid.reshape(info.shape)


def _block_lin(trace, block):
    if block is None or isinstance(block, (int, np.integer)):
        return block
    coords = trace._block_coords
    block = tuple(block)
    if block not in coords:
        raise ValueError(f"block {block} is not in the launch's grid {trace.blocks}")
    return coords.index(block)


def _as_2d(grid: np.ndarray) -> np.ndarray:
    """A 1-D array as one row of cells; 3-D and up as rows of the last axis."""
    if grid.ndim == 1:
        return grid[None, :]
    return grid.reshape(-1, grid.shape[-1])


def _draw_grid(ax, grid, by, coords, title):
    """Cells colored by id (a categorical palette) or by count (a colorbar)."""
    import matplotlib.pyplot as plt

    cells = _as_2d(grid)
    ids = by in ("block", "thread")
    if ids:
        shown = np.ma.masked_less(cells, 0)  # untouched cells stay white
        if cells.max() < 20:  # few ids: one distinct color each
            ax.imshow(shown, cmap="tab20", vmin=-0.5, vmax=19.5, interpolation="nearest")
        else:  # many: neighbouring ids get neighbouring colors
            ax.imshow(shown, cmap="turbo", vmin=0, vmax=cells.max(), interpolation="nearest")
    else:
        image = ax.imshow(cells, cmap="viridis", interpolation="nearest")
        plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=f"{by} per cell")
    # coordinates like "(1,2)" need room: label fewer cells with them than with plain numbers
    tuples = ids and coords is not None and len(coords[0]) > 1
    if cells.size <= (ANNOTATE_MAX_CELLS // 4 if tuples else ANNOTATE_MAX_CELLS):
        for (r, c), v in np.ndenumerate(cells):
            if by in ("count", "threads") or v >= 0:
                label = str(v) if by in ("count", "threads") else format_coord(coords[v])
                ax.text(c, r, label.replace(" ", ""), ha="center", va="center", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_access(trace, name: str, kind: str | None = None, by: str = "block",
                per_block: bool = False, ax=None):
    """A grid of the array's cells colored by who touched them (see touch_grid for `by`).
    per_block=True draws one panel per block (at most 16), cells colored by thread.
    Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    what = f"{kind}s" if kind else "accesses"
    coords = {"block": trace._block_coords, "thread": trace._thread_coords}
    if not per_block:
        fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 4))
        title = {"count": f"{what} per cell", "threads": f"threads per cell ({what})"}
        _draw_grid(ax, touch_grid(trace, name, kind, by), by, coords.get(by),
                   f"{trace.kernel_name}: {name}, {title.get(by, f'{what} by {by}')}")
        return fig
    blocks = trace._block_coords[:16]
    cols = min(4, len(blocks))
    rows = -(-len(blocks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    for ax_, block in zip(axes.flat, blocks, strict=False):
        _draw_grid(ax_, touch_grid(trace, name, kind, "thread", block), "thread",
                   coords["thread"], f"block {format_coord(block)}")
    for ax_ in list(axes.flat)[len(blocks):]:
        ax_.axis("off")
    fig.suptitle(f"{trace.kernel_name}: {name}, {what} by thread, per block", fontsize=10)
    return fig


def _named(traces) -> dict:
    if isinstance(traces, dict):
        return dict(traces)
    return {t.kernel_name: t for t in traces}


def traffic_table(traces) -> str:
    """Global bytes read and written per kernel, and each total against the first kernel's.
    `traces`: a dict {label: Trace} or a list of Traces (labelled by kernel name)."""
    named = _named(traces)
    rows = [("kernel", "read (B)", "written (B)", "total (B)", "vs first")]
    base = None
    for label, t in named.items():
        base = base or t.global_bytes or 1
        rows.append((label, f"{t.global_bytes_read:,}", f"{t.global_bytes_written:,}",
                     f"{t.global_bytes:,}", f"{t.global_bytes / base:.3g}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def draw_traffic(traces, ax=None):
    """Bars of global-memory bytes read and written per kernel. Returns the Figure."""
    import matplotlib.pyplot as plt

    named = _named(traces)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    x = np.arange(len(named))
    read = [t.global_bytes_read / 1024 for t in named.values()]
    written = [t.global_bytes_written / 1024 for t in named.values()]
    ax.bar(x - 0.2, read, width=0.4, label="read")
    ax.bar(x + 0.2, written, width=0.4, label="written")
    for xi, r, w in zip(x, read, written, strict=True):
        ax.text(xi - 0.2, r, f"{r:.3g}", ha="center", va="bottom", fontsize=8)
        ax.text(xi + 0.2, w, f"{w:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, list(named))
    ax.set_ylabel("global memory (KiB)")
    ax.set_title("bytes each kernel asks global memory for", fontsize=10)
    ax.legend()
    return fig
