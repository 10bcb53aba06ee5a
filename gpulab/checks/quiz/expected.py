"""The expected answers of the quiz's numeric questions: the course's own functions applied to a
learner's numbers (gpulab/quiz/variant.py). The grader computes them outside the learner's
kernel, for the id the notebook was handed in under (ANSWERS, read by gpulab/checks/keys.py).

Each function of EXPECTED takes one question's numbers; the imports are inside, so that listing
them imports nothing heavy.
"""

from __future__ import annotations

from functools import cache, partial

from gpulab.quiz.variant import draw


def roofline_time_us(numbers) -> float:
    """q02: the roofline's lower bound on a bf16 LayerNorm, in microseconds."""
    from gpulab.hardware import bound, get_gpu, layernorm_flops_bytes

    flops, n_bytes = layernorm_flops_bytes(numbers.rows, numbers.hidden, "bf16")
    return bound(flops, n_bytes, get_gpu(numbers.gpu), "bf16").time_s * 1e6


def checkpoint_interval_minutes(numbers) -> float:
    """q03: the longest checkpoint interval, in minutes, that keeps the job's expected
    preemption loss at the bound. The job's rate is the sum of its nodes' rates: any node's
    preemption stops every node of a synchronous job."""
    from gpulab.cloud_cost import max_checkpoint_interval

    job_rate = numbers.nodes * numbers.preemptions_per_node_hour
    return 60 * max_checkpoint_interval(job_rate, numbers.max_loss_percent / 100,
                                        restart_hours=numbers.restart_minutes / 60)


def strided_sectors(numbers) -> int:
    """q04: 32-byte sectors one warp's load of x[stride * i], i = 0..31, touches."""
    import numpy as np

    threads, sector, itemsize = 32, 32, np.dtype(numbers.dtype).itemsize
    return len({i * numbers.stride * itemsize // sector for i in range(threads)})


def all_reduce_ms(numbers) -> float:
    """q13: the alpha-beta model's ring all-reduce time, in milliseconds."""
    from gpulab.distributed.cost_model import collective_time

    return collective_time("all_reduce", numbers.n_bytes, numbers.world_size, numbers.alpha,
                           numbers.beta, "ring") * 1e3


def bus_bandwidth(numbers) -> float:
    """q14: nccl-tests' busbw of the all-reduce, in GB/s."""
    from gpulab.distributed.cost_model import algbw, busbw

    return busbw("all_reduce", algbw(numbers.n_bytes, numbers.seconds), p=numbers.world_size)


def zero2_world_size(numbers) -> int:
    """q15: the fewest ranks on which ZeRO-2 holds the model's states beside the reserve."""
    from gpulab.distributed.zero import zero_memory_table
    from gpulab.hardware import get_gpu

    budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9

    def zero2_bytes(world_size: int) -> int:
        rows = {row.strategy: row for row in zero_memory_table(numbers.n_params, world_size)}
        return rows["ZeRO-2"].total_bytes

    return next(n for n in range(1, 4097) if zero2_bytes(n) <= budget)


@cache  # a simulation: once per combination (24), however many learners are graded
def interleaved_bubble(numbers) -> float:
    """q19: the idle fraction of GPU-time in the simulated interleaved 1F1B schedule."""
    from gpulab.distributed.schedule import schedule_interleaved_1f1b

    return schedule_interleaved_1f1b(pp_size=numbers.pp_size,
                                     n_microbatches=numbers.batch // numbers.microbatch,
                                     n_chunks=numbers.n_chunks).bubble_fraction


def masterless_states_gb(numbers) -> float:
    """q22: GB of model states of a bf16 model whose optimizer state follows the weights."""
    from gpulab.memory.recipes import bytes_per_parameter

    return numbers.n_params * sum(bytes_per_parameter("bf16", numbers.optimizer)) / 1e9


# question -> its expected answer, from its numbers
EXPECTED = {"q02": roofline_time_us, "q03": checkpoint_interval_minutes, "q04": strided_sectors,
            "q13": all_reduce_ms, "q14": bus_bandwidth, "q15": zero2_world_size,
            "q19": interleaved_bubble, "q22": masterless_states_gb}


def for_learner(question: str, learner: str):
    """`question`'s expected answer for `learner`: from the numbers drawn from their id."""
    return EXPECTED[question](getattr(draw(learner), question))


# What the grader computes, for each student (gpulab/checks/keys.py: a function of the learner).
ANSWERS = {question: partial(for_learner, question) for question in EXPECTED}
