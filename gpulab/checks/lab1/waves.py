"""Lab 1, Part 6: choosing a launch configuration by occupancy and waves (check_waves).

A kernel handles n elements, one per thread, on a named GPU. Its compiled code needs a number of
registers per thread and of shared-memory bytes per block, so the block size the learner picks
sets how many blocks an SM holds at once (the tightest of four limits: threads, blocks,
registers, shared memory), and with it how many waves the grid runs. The learner picks a block
size and gives the numbers that justify it; the grade is the plan's waves against the fewest any
block size (a multiple of 32, up to 1024) achieves, under the model that every wave takes the
same time.

The expected numbers come from `expected_waves`, which the grader runs outside the learner's
kernel (gpulab/checks/keys.py): a notebook that edits the spec sheet in place changes what its
own kernel computes, not what its answers are compared with.
Taught in: lessons/02_cuda_with_numba.ipynb (section 9, occupancy),
lessons/01_gpu_architecture.ipynb (waves)
"""

from __future__ import annotations

import math

from gpulab.checks.harness.numbers import as_number
from gpulab.hardware import get_gpu

WARP = 32  # a block size is a whole number of warps
MAX_THREADS_PER_BLOCK = 1024
REGISTER_BYTES = 4
HINT = 'gpulab.hint("lab1", "waves")'


def resident_blocks(threads_per_block: int, setting: dict) -> tuple[int, str, dict]:
    """(blocks one SM holds at once, the limit that binds, every limit) for a block size, from a
    setting of expected_waves (all plain numbers)."""
    per_block_smem = setting["smem_per_block"] + setting["smem_per_thread"] * threads_per_block
    limits = {
        "threads": setting["max_threads_per_sm"] // threads_per_block,
        "blocks": setting["max_blocks_per_sm"],
        "registers": setting["registers_per_sm"] // (setting["regs_per_thread"]
                                                     * threads_per_block),
        "shared memory": setting["smem_per_sm"] // per_block_smem,
    }
    binding = min(limits, key=limits.get)
    return limits[binding], binding, limits


def expected_waves(gpu: str, n: int, regs_per_thread: int, smem_per_block: int,
                   smem_per_thread: int, max_threads_per_sm: int, max_blocks_per_sm: int) -> dict:
    """Every block size's plan for the setting, and the fewest waves any of them runs, as plain
    numbers: what check_waves compares with, and what its messages quote."""
    spec = get_gpu(gpu)
    setting = {"gpu": spec.name, "sms": spec.sms, "n": n, "regs_per_thread": regs_per_thread,
               "registers_per_sm": spec.registers_per_sm_kb * 1024 // REGISTER_BYTES,
               "smem_per_sm": spec.smem_per_sm_kb * 1024, "smem_per_block": smem_per_block,
               "smem_per_thread": smem_per_thread, "max_threads_per_sm": max_threads_per_sm,
               "max_blocks_per_sm": max_blocks_per_sm}
    plans = []  # [threads_per_block, blocks, blocks_per_sm, n_waves]: JSON has no int keys
    for tpb in range(WARP, MAX_THREADS_PER_BLOCK + 1, WARP):
        per_sm = resident_blocks(tpb, setting)[0]
        if per_sm:
            blocks = math.ceil(n / tpb)
            plans.append([tpb, blocks, per_sm, math.ceil(blocks / (spec.sms * per_sm))])
    return {**setting, "plans": plans, "fewest_waves": min(p[3] for p in plans)}


def check_waves(threads_per_block, blocks, blocks_per_sm, n_waves, want: dict) -> None:
    """A launch plan: a block size, its grid, what an SM holds of it and the waves it runs, each
    right for that block size, and no more waves than the fewest any block size runs."""
    tpb = as_number(threads_per_block, "threads_per_block")
    if tpb != int(tpb) or tpb % WARP or not WARP <= tpb <= MAX_THREADS_PER_BLOCK:
        raise AssertionError(
            f"threads_per_block is {tpb:g}: a block is a whole number of warps, a multiple of "
            f"{WARP} from {WARP} to {MAX_THREADS_PER_BLOCK}.")
    tpb = int(tpb)
    setting = f"{want['n']:,} elements on an {want['gpu']}, {tpb} threads per block"
    want_blocks = math.ceil(want["n"] / tpb)
    got = as_number(blocks, "blocks")
    if got != want_blocks:
        raise AssertionError(
            f"One thread per element: blocks is {got:g}, expected {want_blocks} ({setting}): "
            "the grid must cover every element, the last block partly empty.")
    per_sm, binding, limits = resident_blocks(tpb, want)
    if per_sm == 0:
        raise AssertionError(
            f"A block of {tpb} threads cannot run on an {want['gpu']} at all: its {binding} "
            f"allow 0 blocks per SM ({_limits_text(tpb, limits, want)}). Pick a smaller one.")
    got = as_number(blocks_per_sm, "blocks_per_sm")
    if got != per_sm:
        raise AssertionError(
            f"An SM holds what its tightest limit allows: blocks_per_sm is {got:g}, expected "
            f"{per_sm} ({setting}; {_limits_text(tpb, limits, want)}: the {binding} allow "
            f"{per_sm}). More: {HINT}.")
    slots = want["sms"] * per_sm
    plan_waves = math.ceil(want_blocks / slots)
    got = as_number(n_waves, "n_waves")
    if got != plan_waves:
        hint = ("The GPU runs whole waves: round up." if math.isclose(got, want_blocks / slots,
                                                                       rel_tol=1e-3)
                else f"A wave runs SMs x blocks_per_sm = {want['sms']} x {per_sm} = {slots} "
                     "blocks at once.")
        raise AssertionError(f"n_waves is {got:g}, expected {plan_waves} for your plan "
                             f"({setting}). {hint}")
    fewest = want["fewest_waves"]
    if plan_waves > fewest:
        raise AssertionError(
            f"Your plan's numbers are right, and it runs {plan_waves} waves; some block sizes "
            f"run it in {fewest}. It holds {per_sm} x {tpb} = {per_sm * tpb} threads per SM "
            f"(the {binding} bind): compare that, and the last wave's fill, across block "
            f"sizes. More: {HINT}.")


def _limits_text(tpb: int, limits: dict, want: dict) -> str:
    smem = want["smem_per_block"] + want["smem_per_thread"] * tpb
    return (f"threads {want['max_threads_per_sm']} // {tpb} = {limits['threads']}, blocks "
            f"{limits['blocks']}, registers {want['registers_per_sm']} // "
            f"({want['regs_per_thread']} x {tpb}) = {limits['registers']}, shared memory "
            f"{want['smem_per_sm']} // {smem} = {limits['shared memory']}")
