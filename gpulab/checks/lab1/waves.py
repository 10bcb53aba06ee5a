"""Lab 1, Part 6: waves and the tail effect (check_waves).

The expected numbers come from `expected_waves`, which the grader runs outside the learner's
kernel (gpulab/checks/keys.py): a notebook that edits the A100's spec sheet in place changes
what its own kernel computes, not what its answers are compared with.
Taught in: lessons/01_gpu_architecture.ipynb
"""

from __future__ import annotations

import numpy as np

from gpulab.checks.harness.numbers import as_number
from gpulab.hardware import get_gpu, waves


def expected_waves(gpu: str, n_blocks: int, blocks_per_sm: int) -> dict:
    """The waves of `n_blocks` blocks on `gpu` at `blocks_per_sm` resident blocks per SM, as
    plain numbers: what check_waves compares with, and what its messages quote."""
    spec = get_gpu(gpu)
    w = waves(n_blocks, spec, blocks_per_sm)
    return {"gpu": spec.name, "sms": spec.sms, "n_blocks": n_blocks,
            "blocks_per_sm": blocks_per_sm, "slots": w.slots, "waves": w.waves,
            "waves_ceil": w.waves_ceil, "tail_blocks": w.tail_blocks,
            "utilization": w.utilization}


def check_waves(n_waves, tail_utilization, utilization, want: dict) -> None:
    """n_waves rounds, the last one's busy fraction, and the busy fraction over all rounds,
    against `want` (expected_waves: the grader's answer key)."""
    setting = (f"{want['n_blocks']} blocks on an {want['gpu']} ({want['sms']} SMs) with "
               f"{want['blocks_per_sm']} blocks per SM: {want['slots']} blocks run at once")
    slots, waves_ceil, tail_blocks = want["slots"], want["waves_ceil"], want["tail_blocks"]
    got = as_number(n_waves, "n_waves")
    if got != waves_ceil:
        hint = ("The GPU runs whole rounds: round n_blocks / slots up."
                if np.isclose(got, want["waves"], rtol=1e-3) else
                "A round (wave) runs `slots` = SMs x blocks_per_sm blocks at once.")
        raise AssertionError(f"n_waves is {got:g}, expected {waves_ceil} ({setting}). {hint}")
    tail = tail_blocks / slots
    got = as_number(tail_utilization, "tail_utilization")
    if not np.isclose(got, tail, rtol=1e-3, atol=1e-4):
        raise AssertionError(
            f"tail_utilization is {got:.4f}, expected {tail:.4f} ({setting}). The last wave "
            f"runs the {tail_blocks} blocks left after {waves_ceil - 1} full wave(s) of "
            f"{slots}; give the fraction of its {slots} slots that are busy (0 to 1).")
    got = as_number(utilization, "utilization")
    if not np.isclose(got, want["utilization"], rtol=1e-3, atol=1e-4):
        raise AssertionError(
            f"utilization is {got:.4f}, expected {want['utilization']:.4f} ({setting}). It is "
            "the useful work over the slots the GPU spends: n_blocks / (n_waves x slots).")
