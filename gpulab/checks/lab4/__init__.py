"""Lab 4, memory and profiling (solutions/lab4_memory_and_profiling/...): its parts and points, and
its checkers.

    check_diagnosis(DOMINANT_CATEGORY, ...)   Part A1  read the OOM's peak
    check_fit_step(fit_step)                  Part A2  fit the step under a memory budget
    check_fast_results(fast_train)            Part B1  a faster pipeline, the same results
    check_speedup(fast_train)                 Part B2  ... and at least 3x as fast, in one run

Taught in: lessons/07_gpu_memory.ipynb, lessons/08_profiling_and_optimization.ipynb
"""

from gpulab.checks.lab4.diagnosis import check_diagnosis, expected_diagnosis
from gpulab.checks.lab4.fast_results import check_fast_results
from gpulab.checks.lab4.fit_step import check_fit_step
from gpulab.checks.lab4.speedup import check_speedup
from gpulab.checks.table import Answer, Assignment, Check, part

ASSIGNMENT = Assignment("lab4_memory_and_profiling", (
    part("diagnosis", 3, Check("check_diagnosis",
                               ("DOMINANT_CATEGORY", "DOMINANT_SHARE", "TIMES_MODEL_STATES"),
                               {"want": Answer("lab4.diagnosis")})),
    part("fit_step", 5, Check("check_fit_step", ("fit_step",))),
    part("fast_results", 2, Check("check_fast_results", ("fast_train",))),
    part("speedup", 4, Check("check_speedup", ("fast_train",), {"min_speedup": 3.0})),
))
# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py).
ANSWERS = {"diagnosis": expected_diagnosis}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_diagnosis", "check_fast_results", "check_fit_step",
           "check_speedup"]
