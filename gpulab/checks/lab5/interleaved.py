"""Checker for Lab 5, Part 7 (solutions/lab5_parallelism_across_nodes/...): a pipeline schedule
the course leaves to the learner, with two model chunks per device (virtual stages `stage` and
`p + stage`), graded by its goal and bounds only. No processes: an order is a list.

    check_interleaved(interleaved_stage, p=4, m=8)

interleaved_stage(p, m, stage) returns ONE device's list of ("F", i, chunk) and ("B", i,
chunk). Any order earns the points that, together with the other devices' lists:
- follows the pipeline's rules (gpulab's check_schedule with n_chunks=2: every action once, a
  forward after the previous virtual stage's, a backward after the next one's, no deadlock);
- holds at most MEMORY_BOUND(p) microbatch-chunks in flight on every device;
- has a bubble, as gpulab's simulate_schedule lays it out (tf = 1, tb = 2, no comm), of at most
  bubble_bound(p, m), the bubble of a pipeline of v = 2 chunks per device: about half 1F1B's.
The messages name the number that fails and what it says about the order: GPipe's memory,
1F1B's bubble, a deadlock. With on_ranks=True the order then runs on p gloo ranks, each holding
two chunks of a small GPT (interleaved_ranks.py), and every parameter's gradient and the loss
must equal the whole GPT's in this process.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb (section 5)
"""

from __future__ import annotations

import torch

from gpulab.checks.harness.owned import require_own_function
from gpulab.checks.harness.ranks import launch
from gpulab.checks.lab5 import interleaved_ranks
from gpulab.checks.lab5.one_f_one_b import call_order
from gpulab.checks.lab5.shared import close, err
from gpulab.distributed.schedule import bubble_fraction_theory, schedule_1f1b, simulate_schedule
from gpulab.distributed.schedule_rules import ScheduleError, check_schedule

N_CHUNKS = 2  # v: model chunks per device
HINT = 'gpulab.hint("lab5", "interleaved")'
SLACK = 1e-9  # float sums of the simulator


def memory_bound(p: int) -> int:
    """The most microbatch-chunks a device may hold between forward and backward: (v + 1) p - 1,
    5.5 microbatches' activations at p = 4, against 1F1B's 4 and GPipe's m."""
    return (N_CHUNKS + 1) * p - 1


def bubble_bound(p: int, m: int) -> float:
    """The largest bubble fraction allowed: idle / (p * makespan) = (p - 1) / (v m + p - 1)."""
    return bubble_fraction_theory(p, m, N_CHUNKS)


def check_interleaved(interleaved_stage, p: int = 4, m: int = 8, on_ranks: bool = False,
                      seed: int = 0) -> None:
    """interleaved_stage(p, m, stage) for every stage: the lists follow the rules with two
    chunks per device, hold at most memory_bound(p) microbatch-chunks in flight, and leave a
    bubble of at most bubble_bound(p, m); on_ranks: run on p ranks, gradients as one GPT's."""
    require_own_function(interleaved_stage, "interleaved_stage")
    if m % p:
        raise ValueError(f"m={m} must be a multiple of p={p}")
    order = [call_order(interleaved_stage, f"interleaved_stage(p={p}, m={m}, stage={s})",
                        "interleaved_order", "('F', i, chunk) and ('B', i, chunk)", p, m, s)
             for s in range(p)]
    case = f"p = {p}, m = {m}, v = {N_CHUNKS} chunks per device"
    try:
        check_schedule(order, p, m, N_CHUNKS)
    except ScheduleError as error:
        raise AssertionError(f"Your schedule ({case}) breaks a rule: {error}\n{HINT} shows "
                             "a way to think about it.") from None
    schedule = simulate_schedule(order, p, m, N_CHUNKS, name="yours")
    peak, limit = schedule.peak_in_flight, memory_bound(p)
    if max(peak) > limit:
        device = peak.index(max(peak))
        gpipe = " That is GPipe's memory: every forward before any backward." if max(
            peak) >= N_CHUNKS * m else ""
        raise AssertionError(
            f"Your schedule ({case}) holds {max(peak)} microbatch-chunks in flight on device "
            f"{device}, more than {limit} = (v + 1) p - 1.{gpipe} Start each backward as soon "
            f"as the bound needs it: a device that holds {limit} runs a backward before its "
            f"next forward. Peaks per device: {peak}. {HINT}")
    bound, plain = bubble_bound(p, m), schedule_1f1b(p, m).bubble_fraction
    if schedule.bubble_fraction > bound + SLACK:
        same = " (1F1B's, as if the two chunks were one stage)" if abs(
            schedule.bubble_fraction - plain) <= SLACK else ""
        raise AssertionError(
            f"Your schedule ({case}) leaves a bubble of {schedule.bubble_fraction:.3f} of the "
            f"stage-time idle{same}; the bound is {bound:.3f} = (p - 1) / (v m + p - 1), 1F1B's "
            f"is {plain:.3f}. The pipeline fills and drains faster when each device's first "
            "chunk works on several microbatches before their second chunks come back to it. "
            f"Your layout in time:\n{schedule.text()}\n{HINT}")
    if on_ranks:
        _run_on_ranks(order, p, m, case, seed)


RANKS_TIMEOUT_S = 60.0  # a GPT of 2p tiny Blocks, m microbatches: a few seconds


def _run_on_ranks(order: list[list[tuple]], p: int, m: int, case: str, seed: int) -> None:
    """The order executed on p ranks against the whole GPT here: every gradient and the loss."""
    from gpulab.models import GPT, GPTConfig

    config = {"vocab_size": 16, "block_size": 8, "n_layer": N_CHUNKS * p, "n_head": 2,
              "n_embd": 8, "dropout": 0.0}
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(**config))
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, config["vocab_size"], (2 * m, 6), generator=g) for _ in range(2))
    logits = gpt(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    data = {"m": m, "config": config, "state": gpt.state_dict(), "x": x, "y": y,
            "order": order}
    results = launch(interleaved_ranks.interleaved_rank, p, data, name="Your schedule on ranks",
                     case=case, timeout_s=RANKS_TIMEOUT_S, ship=(interleaved_ranks,))
    got = {name: grad for res in results for name, grad in res["grads"].items()}
    ran = sum(res["loss"] for res in results)
    if abs(ran - loss.item()) > 1e-5 * max(1.0, abs(loss.item())):
        raise AssertionError(f"Your schedule ({case}) on {p} ranks: the loss came out {ran:.6f}, "
                             f"the whole GPT's is {loss.item():.6f}: a microbatch ran twice or "
                             "not at all.")
    for name, param in gpt.named_parameters():
        if not close(got.get(name), param.grad):
            raise AssertionError(
                f"Your schedule ({case}) on {p} ranks, two chunks of a GPT on each: the "
                f"gradient of {name} is wrong ({err(got.get(name), param.grad)}); every "
                "microbatch's forward and backward must run once through every chunk.")
