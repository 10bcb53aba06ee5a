"""1F1B's bubble and activation memory, measured on gloo ranks, against the theory
(lessons/06_model_pipeline_tensor_parallelism.ipynb, sections 4-5).

A small GPT is cut into p = 2 stages (split_gpt), one gloo rank each, started once; each rank
uses one thread, so the two ranks use the two cores of a small machine (p = 4 would put two
busy ranks on a core and time the operating system's scheduler, not the schedule). A batch
is split into m = 8 microbatches. Rows:

    1F1B bubble, measured          measured_schedule(both ranks' timings).bubble_fraction, the
                                   median over the timed steps after a warm-up. Target: within
                                   10% (relative) of (p-1)/(m+p-1) = 1/9
    1F1B bubble, simulated         simulate_schedule fed each stage's measured mean tf and tb
                                   (reported): unequal stages accounted for, so the gap to the
                                   measured bubble is what the model has no term for (messages,
                                   a waiting process's wake-up). On cores shared with other
                                   work the measured bubble runs above both: a rank that is
                                   descheduled leaves its neighbour waiting (the note gives the
                                   load average)
    microbatches held, stage 0     PipelineResult.peak_held, 1F1B / GPipe at m = 8: min(p, m)/m
    activation bytes, stage 0      the most bytes of tensors that autograd saved for backward
                                   alive at once on stage 0 during a real run of each schedule
                                   (saved_tensors_hooks, weights and the batch aside), 1F1B /
                                   GPipe. Target: within 10% of min(p, m)/m. It checks that the
                                   runtime frees what a backward no longer needs, which peak_held
                                   (a count) cannot show

Figures from a pipeline that computed something else would mean nothing: the last stage checks
every timed step's loss against the unsplit GPT's.
"""

from __future__ import annotations

import os
import statistics

from common import Row

from gpulab.distributed import run_on_ranks

NAME = "pipeline_parallel"
PP_SIZE = 2
N_MICROBATCHES = 8
TOLERANCE = 0.10  # relative


class SavedActivations:
    """Bytes of the tensors autograd saves for backward (weights and `exclude` aside) while
    the context is open: how many are alive now, and the most that were alive at once.

    A storage counts once, however many saved tensors view it, until it is freed: after the
    backward that used it has run and nothing else refers to it."""

    def __init__(self, module, exclude=()):
        import torch

        self._skip = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self._skip |= {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, int] = {}  # id(storage) -> bytes
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.peak_bytes = 0

    def _pack(self, t):
        import weakref

        storage = t.untyped_storage()
        if storage.data_ptr() not in self._skip and id(storage) not in self._live:
            self._live[id(storage)] = storage.nbytes()
            # The storage object lives as long as the memory does (PyTorch keeps its Python
            # object alive with it), so its finalizer marks the moment the bytes are freed.
            weakref.finalize(storage, self._live.pop, id(storage), None)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return t

    @property
    def live_bytes(self) -> int:
        return sum(self._live.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def _pipeline_on_rank(rank, world_size, config, batch, n_microbatches, steps, warmup):
    """This stage's timed 1F1B steps, then one untimed run of each schedule with its saved
    activations watched, and (stage 0) the bytes one microbatch saves."""
    import math

    import torch

    from gpulab.distributed import (
        PipelineStage,
        gpipe_order,
        one_f_one_b_order,
        run_pipeline,
        split_gpt,
    )
    from gpulab.models import GPT
    from gpulab.train import cross_entropy

    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(0)  # the same GPT and batch on every rank
    gpt = GPT(config)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size))  # (B, T) token ids
    y = torch.randint(0, config.vocab_size, (batch, config.block_size))  # next tokens
    module = split_gpt(gpt, world_size)[rank]
    stage = PipelineStage(module, rank, world_size)
    xs, ys = list(x.chunk(n_microbatches)), list(y.chunk(n_microbatches))

    def step(order_of):
        module.zero_grad(set_to_none=True)
        return run_pipeline(stage, order_of(world_size, n_microbatches), xs, ys, cross_entropy)

    timed = [step(one_f_one_b_order) for _ in range(warmup + steps)][warmup:]
    if stage.is_last:  # numbers from a pipeline that computes something else mean nothing
        with torch.no_grad():
            want = cross_entropy(gpt(x), y).item()
        for result in timed:
            if not math.isclose(result.loss, want, rel_tol=1e-5):
                raise AssertionError(f"1F1B loss {result.loss} differs from the unsplit GPT's "
                                     f"{want}")
    memory = {}
    for name, order_of in (("GPipe", gpipe_order), ("1F1B", one_f_one_b_order)):
        with SavedActivations(module, exclude=(x, y)) as saved:
            result = step(order_of)
        memory[name] = (result.peak_held, saved.peak_bytes)
    one_microbatch = None
    if stage.is_first:
        with SavedActivations(module, exclude=(x, y)) as saved:
            out = module(xs[0])
            one_microbatch = saved.live_bytes
        del out
    return timed, memory, one_microbatch


def _bubbles(per_rank, n_microbatches) -> list[tuple[float, float, float]]:
    """Per timed step: the measured bubble, the simulator's from that step's tf and tb, and the
    step's makespan (seconds)."""
    from gpulab.distributed import measured_schedule, one_f_one_b_order, simulate_schedule

    order = one_f_one_b_order(PP_SIZE, n_microbatches)
    figures = []
    for results in zip(*(r[0] for r in per_rank), strict=True):  # one step, every stage
        measured = measured_schedule(results)
        simulated = simulate_schedule(order, PP_SIZE, n_microbatches,
                                      tf=[r.mean_compute("F") for r in results],
                                      tb=[r.mean_compute("B") for r in results])
        figures.append((measured.bubble_fraction, simulated.bubble_fraction, measured.makespan))
    return figures


def run(quick: bool = False) -> list[Row]:
    from gpulab.distributed import bubble_fraction_theory
    from gpulab.models import GPTConfig

    # A microbatch's forward takes tens of ms a stage (quick: about 15), so that the fixed cost
    # of each hand-over between ranks (a gloo message, a process waking up: a few ms on busy
    # cores) is a small part of it.
    n_embd = 256 if quick else 384
    batch = 32  # m = 8 microbatches of 4 sequences
    config = GPTConfig(vocab_size=64, block_size=64, n_layer=4, n_head=4, n_embd=n_embd)
    steps, warmup = (5, 1) if quick else (9, 2)
    m = N_MICROBATCHES
    load_before = os.getloadavg()[0]
    per_rank = run_on_ranks(_pipeline_on_rank, PP_SIZE, config, batch, m, steps, warmup,
                            backend="gloo", timeout_s=300)
    bubbles, simulated_bubbles, makespans = zip(*_bubbles(per_rank, m), strict=True)
    measured = statistics.median(bubbles)
    simulated = statistics.median(simulated_bubbles)
    theory = bubble_fraction_theory(PP_SIZE, m)
    off_theory = measured / theory - 1
    note = (f"GPT {config.n_layer}x{n_embd}, T={config.block_size}, batch {batch}; "
            f"p={PP_SIZE} gloo ranks on this machine's CPU, 1 thread each (p=2 for 2 cores); "
            f"theory {theory:.1%}, measured {off_theory:+.0%} off it; median of {steps} steps "
            f"({min(bubbles):.1%} to {max(bubbles):.1%}) after {warmup} warm-up, step "
            f"{statistics.median(makespans) * 1e3:.0f} ms; load average "
            f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores")
    rows = [
        Row(NAME, f"1F1B bubble, measured (p={PP_SIZE}, m={m})", 100 * measured, "%",
            target=f"within {TOLERANCE:.0%} of {theory:.1%}",
            ok=abs(off_theory) <= TOLERANCE, note=note),
        Row(NAME, "1F1B bubble, simulated from measured tf, tb", 100 * simulated, "%",
            note=f"measured {measured / simulated - 1:+.0%} off it; theory {theory:.1%}"),
    ]
    memory = per_rank[0][1]  # stage 0: the stage that holds the most
    (gpipe_held, gpipe_bytes), (ofob_held, ofob_bytes) = memory["GPipe"], memory["1F1B"]
    want = min(PP_SIZE, m) / m
    held_ratio, bytes_ratio = ofob_held / gpipe_held, ofob_bytes / gpipe_bytes
    one = per_rank[0][2]
    rows += [
        Row(NAME, f"stage 0 microbatches held, 1F1B / GPipe (m={m})", held_ratio, "x",
            target=f"= min(p, m)/m = {want:g}", ok=held_ratio == want,
            note=f"peak_held {ofob_held} vs {gpipe_held}"),
        Row(NAME, f"stage 0 peak activation bytes, 1F1B / GPipe (m={m})", bytes_ratio, "x",
            target=f"within {TOLERANCE:.0%} of {want:g}",
            ok=abs(bytes_ratio / want - 1) <= TOLERANCE,
            note=(f"saved for backward, live at once: {ofob_bytes / 2**20:.1f} vs "
                  f"{gpipe_bytes / 2**20:.1f} MiB = {ofob_bytes / one:.2f} vs "
                  f"{gpipe_bytes / one:.2f} x one microbatch's {one / 2**20:.2f} MiB")),
    ]
    return rows
