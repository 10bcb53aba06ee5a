"""The course quiz (solutions/quiz/quiz.ipynb): its 25 questions and points, the checks their test
cells call (answers.py), and the expected numbers of the numeric questions, computed with the
course's own functions: the grader computes them outside the learner's kernel (keys.py).
Taught in: every lesson; each question's hidden test names the section that explains it.
"""

from gpulab.checks.quiz.answers import check_number, check_pick, grade_number, grade_pick
from gpulab.checks.table import Assignment, Part

# Multiple-choice questions (1 point each); the others ask for a number (2 points each).
CHOICE = ("q01", "q05", "q06", "q07", "q08", "q09", "q10", "q11", "q12", "q16", "q17", "q18",
          "q20", "q21", "q23", "q24", "q25")
ASSIGNMENT = Assignment("quiz", tuple(
    Part(f"q{i:02d}", 1 if f"q{i:02d}" in CHOICE else 2, grade_id_prefix="")
    for i in range(1, 26)))


def _roofline_time_us() -> float:
    from gpulab.hardware import bound, get_gpu, layernorm_flops_bytes

    flops, n_bytes = layernorm_flops_bytes(8192, 8192, "bf16")
    return bound(flops, n_bytes, get_gpu("H100 SXM"), "bf16").time_s * 1e6


def _largest_model_on_h200() -> float:
    """Billions of parameters whose mixed-precision AdamW states fill 3/4 of an H200."""
    from gpulab.hardware import get_gpu
    from gpulab.memory.recipes import bytes_per_parameter

    usable = 0.75 * get_gpu("H200").memory_gb * 1e9
    return usable / sum(bytes_per_parameter("mixed", "adamw")) / 1e9


def _strided_sectors() -> int:
    """32-byte sectors one warp's load of float32 x[3 * i] touches, i = 0..31."""
    threads, stride, itemsize, sector = 32, 3, 4, 32
    return len({i * stride * itemsize // sector for i in range(threads)})


def _all_reduce_ms() -> float:
    from gpulab.distributed.cost_model import collective_time

    return collective_time("all_reduce", 1e9, 8, 5e-6, 1e11, "ring") * 1e3


def _bus_bandwidth() -> float:
    from gpulab.distributed.cost_model import algbw, busbw

    return busbw("all_reduce", algbw(4e9, 50e-3), p=8)


def _zero2_world_size() -> int:
    """The fewest ranks on which ZeRO-2 holds a 20B model's states in 80 - 24 GB per GPU."""
    from gpulab.distributed.zero import zero_memory_table

    def zero2_bytes(world_size: int) -> int:
        rows = {row.strategy: row for row in zero_memory_table(20 * 10**9, world_size)}
        return rows["ZeRO-2"].total_bytes

    return next(n for n in range(1, 1025) if zero2_bytes(n) <= (80 - 24) * 10**9)


def _interleaved_bubble() -> float:
    from gpulab.distributed.schedule import schedule_interleaved_1f1b

    return schedule_interleaved_1f1b(pp_size=8, n_microbatches=64 // 4,
                                     n_chunks=2).bubble_fraction


def _bf16_model_states_gb() -> float:
    from gpulab.memory.recipes import bytes_per_parameter

    return 7e9 * sum(bytes_per_parameter("bf16", "adamw")) / 1e9


# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py).
ANSWERS = {"q02": _roofline_time_us, "q03": _largest_model_on_h200, "q04": _strided_sectors,
           "q13": _all_reduce_ms, "q14": _bus_bandwidth, "q15": _zero2_world_size,
           "q19": _interleaved_bubble, "q22": _bf16_model_states_gb}

__all__ = ["ANSWERS", "ASSIGNMENT", "CHOICE", "check_number", "check_pick", "grade_number",
           "grade_pick"]
