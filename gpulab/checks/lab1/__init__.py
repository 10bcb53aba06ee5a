"""Lab 1, CUDA kernels (solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb): its parts and points,
and its checkers. Each checker launches the learner's kernel itself on inputs it makes, compares
plain NumPy copies of the results with a NumPy reference, and fails with a message that says
which element, what came out against what was expected, and the likely cause. The reference is
computed before the learner's kernel runs (on the simulator, a kernel is Python in the checker's
process), as a copy the kernel is never given.

    check_saxpy(saxpy, sizes)                     Part 1  grid-stride loop
    check_block_sum(block_sum, sizes)             Part 2  coarsened loads, then a tree
    check_transpose(transpose, shapes)            Part 3  a shared tile, no padding, no conflicts
    check_matmul_tiled(matmul_tiled, shapes)      Part 4  tiled matmul, two outputs per thread
    check_histogram(histogram, sizes)             Part 5  atomics, privatized per block
    check_waves(threads_per_block, blocks, ...)   Part 6  a block size chosen by occupancy, waves
    check_stencil(stencil, sizes)                 Part 7  a 1-D convolution, halo in shared memory
    check_block_scan(block_scan, sizes)           Part 8  a prefix sum in log2(THREADS) steps
    check_*_races(kernel)                         Parts 2, 4, 5, 7, 8 under the race detector
    check_*_technique(kernel)                     Parts 2-5, 7, 8: how, not only what: each
                                                  module's technique_verdict, on the simulator's
                                                  trace on both runners (on a GPU, in a simulator
                                                  process, the measured speed printed, ungraded)

Launch configurations are part of each part's spec (config.py); sizes and grids that differ
between the cpu and gpu runners come from gpulab.runner. Where lesson 02 shows a kernel, the part
asks for a variant of it (config.py and each module's docstring say which); hints.py holds each
part's hints, three levels each, for gpulab.hint("lab1", part).
Taught in: lessons/02_cuda_with_numba.ipynb (Parts 1-5, 7, 8; 6's occupancy),
lessons/01_gpu_architecture.ipynb (6's waves)
"""

from gpulab.checks.lab1.block_sum import (
    check_block_sum,
    check_block_sum_races,
    check_block_sum_technique,
)
from gpulab.checks.lab1.histogram import (
    check_histogram,
    check_histogram_races,
    check_histogram_technique,
)
from gpulab.checks.lab1.matmul_tiled import (
    check_matmul_tiled,
    check_matmul_tiled_races,
    check_matmul_tiled_technique,
)
from gpulab.checks.lab1.saxpy import check_saxpy
from gpulab.checks.lab1.scan import (
    check_block_scan,
    check_block_scan_races,
    check_block_scan_technique,
)
from gpulab.checks.lab1.stencil import (
    check_stencil,
    check_stencil_races,
    check_stencil_technique,
)
from gpulab.checks.lab1.transpose import check_transpose, check_transpose_technique
from gpulab.checks.lab1.waves import check_waves, expected_waves
from gpulab.checks.table import Answer, Assignment, Check, part

# The notebook's Part 6: a kernel of one thread per element, 48 registers per thread and
# 4 KB + 32 B per thread of shared memory per block, on an L4 (1536 threads, 24 blocks per SM).
WAVES_SETTING = {"gpu": "L4", "n": 1_000_000, "regs_per_thread": 48, "smem_per_block": 4096,
                 "smem_per_thread": 32, "max_threads_per_sm": 1536, "max_blocks_per_sm": 24}

ASSIGNMENT = Assignment("lab1_cuda_kernels", (
    part("saxpy", 2, Check("check_saxpy", ("saxpy",), {"sizes": [2048, 5000]})),
    part("block_sum", 2, Check("check_block_sum", ("block_sum",), {"sizes": [256, 1000]})),
    part("block_sum_technique", 1, Check("check_block_sum_technique", ("block_sum",))),
    part("transpose", 2, Check("check_transpose", ("transpose",),
                               {"shapes": [(8, 24), (40, 33)]})),
    part("transpose_technique", 2, Check("check_transpose_technique", ("transpose",))),
    part("matmul_tiled", 2, Check("check_matmul_tiled", ("matmul_tiled",),
                                  {"shapes": [(8, 16, 8), (13, 21, 10)]})),
    part("matmul_tiled_technique", 2, Check("check_matmul_tiled_technique", ("matmul_tiled",))),
    part("histogram", 2, Check("check_histogram", ("histogram",), {"sizes": [1000, 4096]})),
    part("histogram_technique", 1, Check("check_histogram_technique", ("histogram",))),
    part("waves", 2, Check("check_waves", ("threads_per_block", "blocks", "blocks_per_sm",
                                            "n_waves"), {"want": Answer("lab1.waves")})),
    part("stencil", 2, Check("check_stencil", ("stencil",), {"sizes": [256, 1000]})),
    part("stencil_technique", 1, Check("check_stencil_technique", ("stencil",))),
    part("block_scan", 2, Check("check_block_scan", ("block_scan",), {"sizes": [256, 1000]})),
    part("block_scan_technique", 1, Check("check_block_scan_technique", ("block_scan",))),
))

# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py).
ANSWERS = {"waves": lambda: expected_waves(**WAVES_SETTING)}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_block_sum", "check_block_sum_races",
           "check_block_sum_technique", "check_histogram", "check_histogram_races",
           "check_histogram_technique", "check_matmul_tiled", "check_matmul_tiled_races",
           "check_matmul_tiled_technique", "check_saxpy", "check_block_scan",
           "check_block_scan_races", "check_block_scan_technique", "check_stencil",
           "check_stencil_races", "check_stencil_technique", "check_transpose",
           "check_transpose_technique", "check_waves"]
