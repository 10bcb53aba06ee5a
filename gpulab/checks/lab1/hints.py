"""Lab 1's hints, for gpulab.hint("lab1", part): three levels per part, asked one at a time.

Level 1 is the idea, level 2 the data layout (who reads and writes what, where the barriers
go), level 3 the index arithmetic, still short of a kernel to paste. A "<part>_technique" test
uses its part's hints. Plain constants: hints never change a grade.
"""

HINTS: dict[str, tuple[str, str, str]] = {
    "saxpy": (
        """A grid far smaller than the array means each thread handles many elements. Let every
        thread walk the array in steps as long as the whole grid, so that on each pass the grid's
        threads cover one contiguous stretch of it.""",
        """On each pass, neighbouring threads touch neighbouring elements (coalesced). A thread
        starts at its own position in the grid and stops when it passes the end of the array, so
        one launch configuration is right for every length.""",
        """Start at cuda.grid(1); step by cuda.gridsize(1), the number of threads in the grid;
        loop while the index is below out.size. The body is one line: a times x plus y.""",
    ),
    "block_sum": (
        """Two phases. First each thread adds its ITEMS_PER_THREAD elements into a private
        running sum (coarsening: a block covers ITEMS_PER_THREAD x THREADS elements). Then the
        block combines its THREADS partial sums as a tree in shared memory: log2(THREADS) steps,
        each halving the number of active threads.""",
        """Phase one: on its k-th load, the block's threads read THREADS neighbouring elements
        together, so a warp's loads stay coalesced (one thread reading a run of its own scatters
        the warp's addresses). Each thread parks its sum in one shared cell; a barrier; then at
        each step the lower half of the active threads adds in the upper half's cells, with a
        barrier after every step that all threads reach. One thread writes the block's result.""",
        """Element k of thread t in block b is x[b * ITEMS_PER_THREAD * THREADS + k * THREADS + t]
        for k in range(ITEMS_PER_THREAD), 0.0 past x.size. The tree: stride from THREADS // 2
        halving to 1; threads t < stride add cell t + stride into cell t; cuda.syncthreads()
        outside the if. Thread 0 writes cell 0 to out[cuda.blockIdx.x] (write, do not add).""",
    ),
    "transpose": (
        """Go through a shared tile: the block reads a tile of a along its rows (coalesced),
        waits, and writes the tile's columns as rows of out (coalesced again). With no padding
        column allowed, avoid bank conflicts by changing WHERE each element sits in the tile, so
        that the 32 elements of one tile column land in 32 different banks.""",
        """Shared memory word w sits in bank w % 32; in a row-major 32-wide tile, column c of
        every row is the same bank. Shift each row's elements by a different amount (a skew), or
        permute them by an XOR with the row number (a swizzle): a row still spans 32 banks, and
        now so does a column. Use the same mapping when writing the tile and when reading it.
        Block (bx, by) of a lands at block (by, bx) of out; each thread moves TILE_DIM //
        BLOCK_ROWS rows, both ways.""",
        """Keep element (r, c) of the tile at tile[r, (c + r) % TILE_DIM], or at tile[r, c ^ r].
        Load: for j in range(0, TILE_DIM, BLOCK_ROWS), r = ty + j, store a[by * TILE_DIM + r,
        bx * TILE_DIM + tx] as element (r, tx). Barrier. Store: out[bx * TILE_DIM + r,
        by * TILE_DIM + tx] gets element (tx, r) of the tile. Guard each access by its array's
        own shape.""",
    ),
    "matmul_tiled": (
        """Tile the K dimension: at each step the block stages one TILE x TILE tile of a and one
        of b in shared memory, and every thread reads its operands from there. With blocks of
        (TILE, TILE // 2) threads, each thread computes two outputs of the block's tile of c, so
        every value it reads of b's tile serves both.""",
        """A thread keeps two accumulators in registers, for two rows of c in the same column
        (rows ty and ty + TILE // 2 of the block's tile keep a warp's accesses together). Each
        step, every thread loads two elements of a's tile and two of b's (0.0 outside the
        matrices), a barrier, the TILE products for each accumulator, and a barrier before the
        next step overwrites the tiles. Add bias once, at the end, and guard only the stores.""",
        """For step t, the two rows r = ty and r = ty + TILE // 2 of the tile: a_tile[r, tx] =
        a[by * TILE + r, t * TILE + tx] and b_tile[r, tx] = b[t * TILE + r, bx * TILE + tx].
        Then for j in range(TILE): acc0 += a_tile[ty, j] * b_tile[j, tx] and acc1 += a_tile[ty +
        TILE // 2, j] * b_tile[j, tx]. Finally c[row, col] = acc + bias[col] for both rows, each
        only if row < M and col < N.""",
    ),
    "histogram": (
        """Count first where only the block's own threads contend: a private copy of the bins in
        shared memory, updated with shared-memory atomics. Only at the end does the block add its
        copy into counts, one global atomic per bin, so global traffic no longer grows with the
        number of values.""",
        """Three phases with a barrier between each: the block's threads zero the shared bins
        together; a grid-stride loop counts every value whose bin is inside the histogram into
        the shared bins; the threads add the shared bins to counts, each thread a few bins.""",
        """The shared array has BINS int32 cells; threads zero and merge bins t, t + blockDim.x,
        ... The value's bin is x[i] // bin_width, skipped when it is BINS or more; count with
        cuda.atomic.add(shared_bins, bin, 1), merge with cuda.atomic.add(counts, bin,
        shared_bins[bin]).""",
    ),
    "waves": (
        """A block size fixes how many blocks an SM can hold at once: the threads, the blocks,
        the registers and the shared memory each allow some number, and the smallest wins. That
        number, times the SMs, is a wave; the grid takes as many waves as it needs to run all
        its blocks. Compare block sizes by the waves they take.""",
        """For a block of T threads: threads allow max_threads_per_sm // T blocks, the block
        limit allows max_blocks_per_sm, registers allow registers_per_sm // (regs_per_thread x
        T), shared memory allows smem_per_sm // (4096 + 32 x T). The grid has ceil(n / T)
        blocks. Fewer waves come from more threads resident per SM, and from a last wave that
        is nearly full.""",
        """The L4's registers_per_sm is registers_per_sm_kb x 1024 // 4 and its shared memory
        smem_per_sm_kb x 1024 bytes (get_gpu("L4")). Loop T over range(32, 1025, 32), compute
        blocks_per_sm as the min of the four limits (skip T where it is 0), and n_waves =
        ceil(ceil(n / T) / (sms x blocks_per_sm)); keep a T with the fewest.""",
    ),
    "stencil": (
        """Neighbouring outputs share all but one of their inputs, so let a block load its inputs
        into shared memory once, plus the halo: the RADIUS inputs on each side that its edge
        threads also need. Then every tap reads shared memory, not global.""",
        """The shared tile holds STENCIL_THREADS + 2 x RADIUS values: the block's own inputs in
        the middle, the left halo before them and the right halo after. Every thread loads its
        own input; a few threads also load one halo value each; 0.0 outside x; one barrier; then
        each thread adds its 2 x RADIUS + 1 weighted taps from the tile.""",
        """Thread t with output i puts x[i] at tile[t + RADIUS]. Threads t < RADIUS also load
        x[i - RADIUS] into tile[t], and threads t >= STENCIL_THREADS - RADIUS load x[i + RADIUS]
        into tile[t + 2 * RADIUS]. After cuda.syncthreads(), out[i] = sum over j in
        range(2 * RADIUS + 1) of w[j] * tile[t + j], for i < n only.""",
    ),
    "block_scan": (
        """Scan in rounds, as a tree: after round d every element holds the sum of the 2**(d+1)
        inputs that end at it. Each round, every element adds the partial sum a fixed distance
        before it, the distance doubling each round: log2(SCAN_THREADS) rounds in all.""",
        """Keep the block's values in shared memory, one cell per thread. In a round, every
        thread reads the cell `offset` places before its own while nobody writes, then writes its
        new sum: a barrier between the reads and the writes, and another before the next round.
        A thread whose cell is within `offset` of the start adds nothing.""",
        """cache[t] = x[i] (0.0 past the end); barrier; for offset = 1, 2, 4, ... below
        SCAN_THREADS: add = cache[t - offset] if t >= offset else 0.0; cuda.syncthreads();
        cache[t] += add; cuda.syncthreads(). Then out[i] = cache[t] for i < n.""",
    ),
}
