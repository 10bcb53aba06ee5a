"""The course quiz (solutions/quiz/quiz.ipynb): its 25 questions and points, the checks their test
cells call (answers.py), and the expected numbers of the numeric questions, computed with the
course's own functions: the grader computes them outside the learner's kernel (keys.py).
Taught in: every lesson; each question's hidden test names the section that explains it.
"""

from gpulab.checks.quiz.answers import check_number, check_pick, grade_number, grade_pick
from gpulab.checks.table import Assignment, Part

# Multiple-choice questions (1 point each); the others ask for a number (2 points each).
CHOICE = ("q01", "q03", "q06", "q07", "q08", "q09", "q10", "q11", "q13", "q14", "q17", "q18",
          "q19", "q21", "q22", "q24", "q25")
ASSIGNMENT = Assignment("quiz", tuple(
    Part(f"q{i:02d}", 1 if f"q{i:02d}" in CHOICE else 2, grade_id_prefix="")
    for i in range(1, 26)))


def _roofline_time_us() -> float:
    from gpulab.hardware import bound, get_gpu, layernorm_flops_bytes

    flops, n_bytes = layernorm_flops_bytes(8192, 8192, "bf16")
    return bound(flops, n_bytes, get_gpu("H100 SXM"), "bf16").time_s * 1e6


def _waves_utilization() -> float:
    from gpulab.hardware import get_gpu, waves

    return waves(1000, get_gpu("A100 80GB SXM"), blocks_per_sm=4).utilization


def _guard_threads() -> int:
    n, threads_per_block = 1_000_000, 256
    return -(-n // threads_per_block) * threads_per_block - n


def _all_reduce_ms() -> float:
    from gpulab.distributed.cost_model import collective_time

    return collective_time("all_reduce", 1e9, 8, 5e-6, 1e11, "ring") * 1e3


def _bus_bandwidth() -> float:
    from gpulab.distributed.cost_model import algbw, busbw

    return busbw("all_reduce", algbw(4e9, 50e-3), p=8)


def _zero2_gb() -> float:
    from gpulab.distributed.zero import zero_memory_table

    rows = {row.strategy: row for row in zero_memory_table(13 * 10**9, 16, 2, 2, 12)}
    return rows["ZeRO-2"].total_bytes / 1e9


def _gpipe_bubble() -> float:
    from gpulab.distributed.schedule import schedule_gpipe

    return schedule_gpipe(pp_size=8, n_microbatches=24).bubble_fraction


def _model_states_gb() -> float:
    from gpulab.memory.recipes import bytes_per_parameter

    return 1.3e9 * sum(bytes_per_parameter("bf16-autocast", "adamw")) / 1e9


# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py).
ANSWERS = {"q02": _roofline_time_us, "q04": _waves_utilization, "q05": _guard_threads,
           "q12": _all_reduce_ms, "q15": _bus_bandwidth, "q16": _zero2_gb, "q20": _gpipe_bubble,
           "q23": _model_states_gb}

__all__ = ["ANSWERS", "ASSIGNMENT", "CHOICE", "check_number", "check_pick", "grade_number",
           "grade_pick"]
