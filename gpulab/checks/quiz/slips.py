"""The known wrong answers of the quiz's numeric questions, computed from a learner's numbers:
what a hidden test's message names when a number matches one (answers.grade_number), so that
the message says which step went wrong without giving the answer.

    known_slips("q19", "ada")   # {"That ignores n_chunks: ...": (48,), ...}

Each function of SLIPS takes one question's numbers (gpulab/quiz/variant.py) and returns
{the sentence that names the mistake: the numbers it gives}. Plain arithmetic on the numbers
and the spec sheet: a slip only chooses a message, never a grade. tests/test_quiz_slips.py
checks that, for every draw, each slip misses the answer by more than the grader's tolerance.
"""

from __future__ import annotations

import math

from gpulab.quiz.variant import draw


def _ring_factor(p: int) -> float:
    """Bytes through each link of a ring all-reduce, per byte of the buffer: 2 (p - 1) / p."""
    return 2 * (p - 1) / p


def _ridge(gpu: str) -> float:
    from gpulab.hardware import ops_per_byte

    return ops_per_byte(gpu, "bf16")


def _first_tokens(hidden: int, out_features: int, ridge: float) -> int:
    """The fewest tokens for which x @ W, W (hidden, out_features), reaches `ridge` FLOP/byte
    in bf16: t h o / (t h + h o + t o) >= ridge."""
    h, o = hidden, out_features
    return math.floor(ridge * h * o / (h * o - ridge * (h + o))) + 1


def compute_bound_tokens(numbers) -> dict:
    ridge = _ridge(numbers.gpu)
    answer = _first_tokens(numbers.hidden, 4 * numbers.hidden, ridge)
    return {
        "That is the ridge point, the intensity the matmul must reach, not the number of "
        "tokens that reaches it.": (ridge, math.floor(ridge), math.ceil(ridge)),
        "That is the largest count still memory-bound: the question asks for the first that is "
        "compute-bound.": (answer - 1,),
        "That is the count for a square W of shape (hidden, hidden); this W is "
        "(hidden, 4 * hidden).": (_first_tokens(numbers.hidden, numbers.hidden, ridge),),
        "That counts a multiply-add as one FLOP; the roofline counts it as two.":
            (_first_tokens(numbers.hidden, 4 * numbers.hidden, 2 * ridge),),
    }


def max_spot_nodes(numbers) -> dict:
    rate, bound = numbers.preemptions_per_node_hour, numbers.max_loss_percent / 100
    tau, restart = numbers.checkpoint_minutes / 60, numbers.restart_minutes / 60
    nodes = bound / (rate * (tau / 2 + restart))
    return {
        "That many nodes lose more than the bound: round the count down, not up.":
            (math.floor(nodes) + 1, nodes),
        "That counts a whole checkpoint interval lost per preemption; on average a preemption "
        "loses half of it.": (math.floor(bound / (rate * (tau + restart))),),
        "That leaves out the restart each preemption costs.":
            (math.floor(bound / (rate * tau / 2)),),
    }


def strided_sectors(numbers) -> dict:
    itemsize = {"float16": 2, "float32": 4}[numbers.dtype]
    return {
        "That is one sector per thread; threads whose elements share a sector share its "
        "fetch.": (32,),
        "That is the count for 32 contiguous elements; the stride spreads them over more "
        "sectors.": (math.ceil(32 * itemsize / 32),),
    }


def link_for_budget_gbps(numbers) -> dict:
    p, n = numbers.world_size, numbers.n_bytes
    budget_s = numbers.budget_ms / 1e3
    after_latency = budget_s - 2 * (p - 1) * numbers.alpha
    return {
        "That leaves out the latency term: the ring's 2 (p - 1) messages of alpha each spend "
        "the budget too.": (_ring_factor(p) * n / budget_s / 1e9,),
        "That is the buffer over the time (algbw); each link carries 2 (p - 1) / p times the "
        "buffer.": (n / after_latency / 1e9, n / budget_s / 1e9),
        "That counts the reduce-scatter's bytes only; the all-gather moves as many again.":
            (_ring_factor(p) / 2 * n / after_latency / 1e9,),
    }


def algbw_elsewhere_gbps(numbers) -> dict:
    algbw, here, there = numbers.algbw_gbps, numbers.world_size, numbers.other_world_size
    return {
        "That is the algbw unchanged; the bytes each link carries, 2 (p - 1) / p of the buffer, "
        "depend on p.": (algbw,),
        "That scales by the factor the wrong way round: the more GPUs, the more each link "
        "carries per byte of the buffer.": (algbw * _ring_factor(there) / _ring_factor(here),),
        "That is the busbw, the links' bandwidth; nccl-tests' algbw is the buffer over the "
        "time.": (algbw * _ring_factor(here),),
    }


def zero2_largest_model_billions(numbers) -> dict:
    from gpulab.hardware import get_gpu

    memory = get_gpu(numbers.gpu).memory_gb * 1e9
    budget, w = memory - numbers.reserved_gb * 1e9, numbers.world_size
    return {
        "That shards the weights too (ZeRO-3); ZeRO-2 keeps all the 16-bit weights on every "
        "GPU.": (budget / (16 / w) / 1e9,),
        "That keeps whole gradients on every GPU (ZeRO-1); ZeRO-2 shards them too.":
            (budget / (4 + 12 / w) / 1e9,),
        "That leaves out the reserve each GPU keeps for activations and buffers.":
            (memory / (2 + 14 / w) / 1e9,),
        "That shards nothing (plain data parallelism); ZeRO-2 shards the gradients and the "
        "optimizer state.": (budget / 16 / 1e9,),
    }


def microbatches_for_bubble(numbers) -> dict:
    p, v, bound = numbers.pp_size, numbers.n_chunks, numbers.max_bubble_percent / 100
    exact = (p - 1) * (1 - bound) / (bound * v)  # (p - 1) / (v m + p - 1) = bound, for m

    def rounded_up(m: float) -> int:
        return math.ceil(m / p) * p

    answer = rounded_up(exact)
    return {
        "That ignores n_chunks: it is the count for plain 1F1B, one chunk per GPU.":
            (rounded_up(exact * v),),
        "That holds the bubble *ratio*, bubble time over useful time, to the bound; the "
        "question bounds the idle share of all the GPU-time.":
            (rounded_up((p - 1) / (bound * v)),),
        "That is not a multiple of pp_size: the interleaved schedule runs microbatches in "
        "rounds of pp_size.": (exact, math.ceil(exact)),
        "That many microbatches leave the bubble above the bound: the next multiple of pp_size "
        "is the first that holds it.": (answer - p,),
        "That is the bubble bound itself; the question asks how many microbatches reach it.":
            (bound, numbers.max_bubble_percent),
    }


def masterless_largest_model_billions(numbers) -> dict:
    from gpulab.hardware import get_gpu

    memory = get_gpu(numbers.gpu).memory_gb * 1e9
    budget, moments = memory - numbers.reserved_gb * 1e9, {"adamw": 2, "sgd-momentum": 1}[
        numbers.optimizer]
    return {
        "That keeps an fp32 master copy and fp32 moments (the mixed recipe); here the "
        "optimizer state follows the bf16 weights.": (budget / (2 + 2 + 4 + 4 * moments) / 1e9,),
        "That keeps the optimizer's moments in fp32; they follow the weights' dtype, bf16.":
            (budget / (2 + 2 + 4 * moments) / 1e9,),
        "That leaves out the gradients, one per weight, as large as the weights.":
            (budget / (2 + 2 * moments) / 1e9,),
        "That leaves out the reserve the GPU keeps for activations and buffers.":
            (memory / (2 + 2 + 2 * moments) / 1e9,),
    }


# question -> its known slips, from its numbers (EXPECTED's questions, in the same order)
SLIPS = {"q02": compute_bound_tokens, "q03": max_spot_nodes, "q04": strided_sectors,
         "q13": link_for_budget_gbps, "q14": algbw_elsewhere_gbps,
         "q15": zero2_largest_model_billions, "q19": microbatches_for_bubble,
         "q22": masterless_largest_model_billions}


def known_slips(question: str, learner: str) -> dict[str, tuple[float, ...]]:
    """`question`'s known wrong answers for `learner`: {the sentence naming the mistake: the
    numbers it gives}, from the numbers drawn from their id."""
    return SLIPS[question](getattr(draw(learner), question))
