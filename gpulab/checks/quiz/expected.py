"""The expected answers of the quiz's numeric questions: the course's own functions applied to a
learner's numbers (gpulab/quiz/variant.py). The questions ask for what no one of those functions
returns (an inverse, a comparison, a count), so each answer here searches or combines them; the
tests check each against the closed form a learner derives (tests/test_quiz_variants.py). The
grader computes them outside the learner's kernel, for the id the notebook was handed in under
(ANSWERS, read by gpulab/checks/keys.py).

Each function of EXPECTED takes one question's numbers; the imports are inside, so that listing
them imports nothing heavy.
"""

from __future__ import annotations

from functools import partial

from gpulab.quiz.variant import draw


def compute_bound_tokens(numbers) -> int:
    """q02: the fewest tokens (rows of x) for which x @ W, W (hidden, 4 * hidden), is
    compute-bound in bf16 by the roofline: the first count whose regime is "compute"."""
    from gpulab.hardware import bound, gemm_flops_bytes, get_gpu

    gpu, hidden = get_gpu(numbers.gpu), numbers.hidden

    def regime(tokens: int) -> str:
        return bound(*gemm_flops_bytes(tokens, 4 * hidden, hidden, "bf16"), gpu, "bf16").regime

    return next(tokens for tokens in range(1, 100_000) if regime(tokens) == "compute")


def max_spot_nodes(numbers) -> int:
    """q03: the most nodes whose job keeps its expected preemption loss at the bound. The job's
    rate is the sum of its nodes' rates: any node's preemption stops every node."""
    from gpulab.cloud_cost import preemption_loss_fraction

    def loss(nodes: int) -> float:
        return preemption_loss_fraction(nodes * numbers.preemptions_per_node_hour,
                                        numbers.checkpoint_minutes / 60,
                                        restart_hours=numbers.restart_minutes / 60)

    return next(nodes for nodes in range(1, 100_000)
                if loss(nodes + 1) > numbers.max_loss_percent / 100)


def strided_sectors(numbers) -> int:
    """q04: 32-byte sectors one warp's load of x[stride * i], i = 0..31, touches."""
    import numpy as np

    threads, sector, itemsize = 32, 32, np.dtype(numbers.dtype).itemsize
    return len({i * numbers.stride * itemsize // sector for i in range(threads)})


def link_for_budget_gbps(numbers) -> float:
    """q13: the link bandwidth, in GB/s, at which the alpha-beta model's ring all-reduce takes
    exactly the budget. The model's time is latency + volume / beta, linear in 1 / beta."""
    import math

    from gpulab.distributed.cost_model import ring_all_reduce_time

    n_bytes, p = numbers.n_bytes, numbers.world_size
    latency = ring_all_reduce_time(n_bytes, p, numbers.alpha, math.inf)  # steps * alpha
    volume = ring_all_reduce_time(n_bytes, p, 0.0, 1.0)  # bytes through the busiest link
    return volume / (numbers.budget_ms / 1e3 - latency) / 1e9


def algbw_elsewhere_gbps(numbers) -> float:
    """q14: the algbw, in GB/s, of a large all-reduce on other_world_size GPUs whose links are
    those that gave algbw_gbps on world_size: the busbw (the link's bandwidth) is the same."""
    from gpulab.distributed.cost_model import busbw

    link = busbw("all_reduce", numbers.algbw_gbps, numbers.world_size)
    return link / busbw("all_reduce", 1.0, numbers.other_world_size)


def zero2_largest_model_billions(numbers) -> float:
    """q15: the most parameters, in billions, whose ZeRO-2 states (mixed-precision Adam) fit in
    each GPU's memory beside the reserve. Each rank's bytes grow in proportion to the model."""
    from gpulab.distributed.zero import zero_memory_table
    from gpulab.hardware import get_gpu

    budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9
    reference = numbers.world_size * 10**9  # a size every shard divides: no rounding
    rows = {row.strategy: row for row in zero_memory_table(reference, numbers.world_size)}
    return budget / (rows["ZeRO-2"].total_bytes / reference) / 1e9


def microbatches_for_bubble(numbers) -> int:
    """q19: the fewest microbatches, a multiple of pp_size as the interleaved schedule needs,
    whose bubble (idle share of GPU-time, uniform costs) is at most the bound."""
    from gpulab.distributed.schedule import bubble_fraction_theory

    p, bound = numbers.pp_size, numbers.max_bubble_percent / 100
    return next(m for m in range(p, 100_000, p)
                if bubble_fraction_theory(p, m, numbers.n_chunks) <= bound)


def masterless_largest_model_billions(numbers) -> float:
    """q22: the most parameters, in billions, whose model states fit in one GPU's memory beside
    the reserve, for a bf16 model whose optimizer state follows the weights."""
    from gpulab.hardware import get_gpu
    from gpulab.memory.recipes import bytes_per_parameter

    budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9
    return budget / sum(bytes_per_parameter("bf16", numbers.optimizer)) / 1e9


# question -> its expected answer, from its numbers
EXPECTED = {"q02": compute_bound_tokens, "q03": max_spot_nodes, "q04": strided_sectors,
            "q13": link_for_budget_gbps, "q14": algbw_elsewhere_gbps,
            "q15": zero2_largest_model_billions, "q19": microbatches_for_bubble,
            "q22": masterless_largest_model_billions}


def for_learner(question: str, learner: str):
    """`question`'s expected answer for `learner`: from the numbers drawn from their id."""
    return EXPECTED[question](getattr(draw(learner), question))


# What the grader computes, for each student (gpulab/checks/keys.py: a function of the learner).
ANSWERS = {question: partial(for_learner, question) for question in EXPECTED}
