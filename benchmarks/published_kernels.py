"""The kernels of two published tables, written in Numba line for line, for bench_cost_model.

CUDA C++ Best Practices Guide, "Shared Memory in Matrix Multiplication", Tesla V100, w = 32
(TILE_DIM); blocks of w x w threads; A is M x w, B is w x N; effective bandwidth, GB/s:
    C = AB:    simpleMultiply 119.9, coalescedMultiply (a tile of A) 144.4,
               sharedABMultiply (tiles of A and B) 195.5
    C = AA^T:  simpleMultiply 12.8, coalescedMultiply (a [w][w] tile) 140.2,
               the same with a [w][w+1] tile 199.4
Simon Boehm, "How to Optimize a CUDA Matmul Kernel for cuBLAS-like Performance: a Worklog",
RTX A6000, SGEMM of 4092^2 fp32 matrices, GFLOP/s:
    1 naive 309.0, 2 global-memory coalescing 1986.5, 3 shared-memory cache blocking 2980.3,
    4 1D block tiling 8474.7, 5 2D block tiling 15971.7
Arrays are flat, as in the originals; `c = alpha * tmp + beta * c` keeps Boehm's read of C.
"""

from __future__ import annotations

from numba import cuda, float32

W = 32  # the guide's TILE_DIM
BS = 32  # Boehm's BLOCKSIZE (kernels 1-3)
BM4, BN4, BK4, TM4 = 64, 64, 8, 8  # kernel 4
BM5, BN5, BK5, TM5, TN5 = 128, 128, 8, 8, 8  # kernel 5

# ----------------------------------------------------------------------------- the guide


@cuda.jit
def ab_simple(a, b, c, n):
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    for i in range(W):
        s += a[row * W + i] * b[i * n + col]
    c[row * n + col] = s


@cuda.jit
def ab_tile_of_a(a, b, c, n):
    a_tile = cuda.shared.array((W, W), float32)
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    a_tile[cuda.threadIdx.y, cuda.threadIdx.x] = a[row * W + cuda.threadIdx.x]
    # The guide's __syncwarp(): a warp reads only the row it wrote; no block barrier.
    for i in range(W):
        s += a_tile[cuda.threadIdx.y, i] * b[i * n + col]
    c[row * n + col] = s


@cuda.jit
def ab_tiles_of_a_and_b(a, b, c, n):
    a_tile = cuda.shared.array((W, W), float32)
    b_tile = cuda.shared.array((W, W), float32)
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    a_tile[cuda.threadIdx.y, cuda.threadIdx.x] = a[row * W + cuda.threadIdx.x]
    b_tile[cuda.threadIdx.y, cuda.threadIdx.x] = b[cuda.threadIdx.y * n + col]
    cuda.syncthreads()
    for i in range(W):
        s += a_tile[cuda.threadIdx.y, i] * b_tile[i, cuda.threadIdx.x]
    c[row * n + col] = s


@cuda.jit
def aat_simple(a, c, m):
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    for i in range(W):
        s += a[row * W + i] * a[col * W + i]
    c[row * m + col] = s


@cuda.jit
def aat_tile(a, c, m):
    a_tile = cuda.shared.array((W, W), float32)
    transposed = cuda.shared.array((W, W), float32)
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    a_tile[cuda.threadIdx.y, cuda.threadIdx.x] = a[row * W + cuda.threadIdx.x]
    transposed[cuda.threadIdx.x, cuda.threadIdx.y] = \
        a[(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.y) * W + cuda.threadIdx.x]
    cuda.syncthreads()
    for i in range(W):
        s += a_tile[cuda.threadIdx.y, i] * transposed[i, cuda.threadIdx.x]
    c[row * m + col] = s


@cuda.jit
def aat_padded_tile(a, c, m):
    a_tile = cuda.shared.array((W, W), float32)
    transposed = cuda.shared.array((W, W + 1), float32)
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    s = float32(0.0)
    a_tile[cuda.threadIdx.y, cuda.threadIdx.x] = a[row * W + cuda.threadIdx.x]
    transposed[cuda.threadIdx.x, cuda.threadIdx.y] = \
        a[(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.y) * W + cuda.threadIdx.x]
    cuda.syncthreads()
    for i in range(W):
        s += a_tile[cuda.threadIdx.y, i] * transposed[i, cuda.threadIdx.x]
    c[row * m + col] = s


# ----------------------------------------------------------------------------- Boehm's SGEMM


@cuda.jit
def sgemm_naive(m, n, k, alpha, a, b, beta, c):
    x = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # threadIdx.x down the rows
    y = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if x < m and y < n:
        tmp = float32(0.0)
        for i in range(k):
            tmp += a[x * k + i] * b[i * n + y]
        c[x * n + y] = alpha * tmp + beta * c[x * n + y]


@cuda.jit
def sgemm_coalesced(m, n, k, alpha, a, b, beta, c):
    x = cuda.blockIdx.x * BS + cuda.threadIdx.x // BS
    y = cuda.blockIdx.y * BS + cuda.threadIdx.x % BS  # a warp along a row of B and C
    if x < m and y < n:
        tmp = float32(0.0)
        for i in range(k):
            tmp += a[x * k + i] * b[i * n + y]
        c[x * n + y] = alpha * tmp + beta * c[x * n + y]


@cuda.jit
def sgemm_shared(m, n, k, alpha, a, b, beta, c):
    a_s = cuda.shared.array(BS * BS, float32)
    b_s = cuda.shared.array(BS * BS, float32)
    thread_col, thread_row = cuda.threadIdx.x % BS, cuda.threadIdx.x // BS
    a_at = cuda.blockIdx.x * BS * k
    b_at = cuda.blockIdx.y * BS
    c_at = cuda.blockIdx.x * BS * n + cuda.blockIdx.y * BS
    tmp = float32(0.0)
    for _ in range(0, k, BS):
        a_s[thread_row * BS + thread_col] = a[a_at + thread_row * k + thread_col]
        b_s[thread_row * BS + thread_col] = b[b_at + thread_row * n + thread_col]
        cuda.syncthreads()
        a_at += BS
        b_at += BS * n
        for dot in range(BS):
            tmp += a_s[thread_row * BS + dot] * b_s[dot * BS + thread_col]
        cuda.syncthreads()
    at = c_at + thread_row * n + thread_col
    c[at] = alpha * tmp + beta * c[at]


@cuda.jit
def sgemm_1d_tiles(m, n, k, alpha, a, b, beta, c):
    a_s = cuda.shared.array(BM4 * BK4, float32)
    b_s = cuda.shared.array(BK4 * BN4, float32)
    thread_col, thread_row = cuda.threadIdx.x % BN4, cuda.threadIdx.x // BN4
    a_at = cuda.blockIdx.y * BM4 * k
    b_at = cuda.blockIdx.x * BN4
    c_at = cuda.blockIdx.y * BM4 * n + cuda.blockIdx.x * BN4
    inner_col_a, inner_row_a = cuda.threadIdx.x % BK4, cuda.threadIdx.x // BK4
    inner_col_b, inner_row_b = cuda.threadIdx.x % BN4, cuda.threadIdx.x // BN4
    results = cuda.local.array(TM4, float32)
    for r in range(TM4):
        results[r] = 0.0
    for _ in range(0, k, BK4):
        a_s[inner_row_a * BK4 + inner_col_a] = a[a_at + inner_row_a * k + inner_col_a]
        b_s[inner_row_b * BN4 + inner_col_b] = b[b_at + inner_row_b * n + inner_col_b]
        cuda.syncthreads()
        a_at += BK4
        b_at += BK4 * n
        for dot in range(BK4):
            tmp_b = b_s[dot * BN4 + thread_col]
            for r in range(TM4):
                results[r] += a_s[(thread_row * TM4 + r) * BK4 + dot] * tmp_b
        cuda.syncthreads()
    for r in range(TM4):
        at = c_at + (thread_row * TM4 + r) * n + thread_col
        c[at] = alpha * results[r] + beta * c[at]


@cuda.jit
def sgemm_2d_tiles(m, n, k, alpha, a, b, beta, c):
    a_s = cuda.shared.array(BM5 * BK5, float32)
    b_s = cuda.shared.array(BK5 * BN5, float32)
    threads = (BM5 * BN5) // (TM5 * TN5)
    thread_col = cuda.threadIdx.x % (BN5 // TN5)
    thread_row = cuda.threadIdx.x // (BN5 // TN5)
    a_at = cuda.blockIdx.y * BM5 * k
    b_at = cuda.blockIdx.x * BN5
    c_at = cuda.blockIdx.y * BM5 * n + cuda.blockIdx.x * BN5
    inner_row_a, inner_col_a = cuda.threadIdx.x // BK5, cuda.threadIdx.x % BK5
    inner_row_b, inner_col_b = cuda.threadIdx.x // BN5, cuda.threadIdx.x % BN5
    stride_a, stride_b = threads // BK5, threads // BN5
    results = cuda.local.array(TM5 * TN5, float32)
    reg_m = cuda.local.array(TM5, float32)
    reg_n = cuda.local.array(TN5, float32)
    for r in range(TM5 * TN5):
        results[r] = 0.0
    for _ in range(0, k, BK5):
        for off in range(0, BM5, stride_a):
            a_s[(inner_row_a + off) * BK5 + inner_col_a] = \
                a[a_at + (inner_row_a + off) * k + inner_col_a]
        for off in range(0, BK5, stride_b):
            b_s[(inner_row_b + off) * BN5 + inner_col_b] = \
                b[b_at + (inner_row_b + off) * n + inner_col_b]
        cuda.syncthreads()
        a_at += BK5
        b_at += BK5 * n
        for dot in range(BK5):
            for i in range(TM5):
                reg_m[i] = a_s[(thread_row * TM5 + i) * BK5 + dot]
            for i in range(TN5):
                reg_n[i] = b_s[dot * BN5 + thread_col * TN5 + i]
            for rm in range(TM5):
                for rn in range(TN5):
                    results[rm * TN5 + rn] += reg_m[rm] * reg_n[rn]
        cuda.syncthreads()
    for rm in range(TM5):
        for rn in range(TN5):
            at = c_at + (thread_row * TM5 + rm) * n + thread_col * TN5 + rn
            c[at] = alpha * results[rm * TN5 + rn] + beta * c[at]
