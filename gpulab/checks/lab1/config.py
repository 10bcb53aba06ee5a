"""Lab 1's launch configurations, as the notebook states them: grids and tile sizes that
differ between the cpu and gpu runners come from gpulab.runner.
"""

from __future__ import annotations

import gpulab

# (blocks, threads_per_block) of the grid-stride parts: a fixed grid, smaller than the arrays.
GRID = gpulab.runner.pick(cpu=(2, 32), gpu=(8, 128))
TILE_DIM, BLOCK_ROWS = 32, 8  # transpose: 32 x 32 tiles, blocks of 32 x 8 threads (4 rows each)
BLOCK_SUM_THREADS = 64  # the notebook's THREADS: block_sum's blocks have this many threads
ITEMS_PER_THREAD = 4  # block_sum: each block sums ITEMS_PER_THREAD x THREADS elements
TILE = 8  # the notebook's TILE: matmul_tiled computes TILE x TILE tiles of c ...
OUTPUTS_PER_THREAD = 2  # ... with blocks of (TILE, TILE // 2) threads, two outputs each
HISTOGRAM_BINS, HISTOGRAM_WIDTH = 16, 4  # Part 5: counts.size and bin_width
STENCIL_THREADS, RADIUS = 64, 3  # the stencil's block size, and its taps on each side (7 in all)
SCAN_THREADS = 64  # block_scan's block: each block scans its 64 elements
