"""Lab 4, memory and profiling (solutions/lab4_memory_and_profiling/...): its parts and points, and
its checkers.

    check_diagnosis(DOMINANT_CATEGORY, ...)     Part A1  read the OOM's peak
    check_fit_step(fit_step)                    Part A2  fit the step under a memory budget
    check_profile_reading(DOMINANT_PHASE, ...)  Part B1  read the slow pipeline's profile
    check_fast_results(fast_train)              Part B2  a faster pipeline, the same results
    check_fast_technique(fast_train)            Part B3  ... no syncs, copies, micro-batches
    check_speedup(fast_train)                   Part B4  ... and at least 3x as fast, in one run

Taught in: lessons/07_gpu_memory.ipynb, lessons/08_profiling_and_optimization.ipynb
"""

from gpulab.checks.lab4.diagnosis import check_diagnosis, expected_diagnosis
from gpulab.checks.lab4.fast_results import check_fast_results
from gpulab.checks.lab4.fit_step import check_fit_step
from gpulab.checks.lab4.profile_reading import check_profile_reading, expected_profile
from gpulab.checks.lab4.speedup import check_speedup
from gpulab.checks.lab4.technique import check_fast_technique
from gpulab.checks.table import Answer, Assignment, Check, part

ASSIGNMENT = Assignment("lab4_memory_and_profiling", (
    part("diagnosis", 3, Check("check_diagnosis",
                               ("DOMINANT_CATEGORY", "DOMINANT_SHARE", "TIMES_MODEL_STATES"),
                               {"want": Answer("lab4.diagnosis")})),
    part("fit_step", 5, Check("check_fit_step", ("fit_step",))),
    part("profile_reading", 3, Check("check_profile_reading",
                                     ("DOMINANT_PHASE", "PHASE_SHARE", "SYNCS_PER_STEP",
                                      "H2D_BYTES_PER_STEP", "profile"),
                                     {"want": Answer("lab4.profile_reading")})),
    part("fast_results", 2, Check("check_fast_results", ("fast_train",))),
    part("fast_technique", 2, Check("check_fast_technique", ("fast_train",))),
    part("speedup", 4, Check("check_speedup", ("fast_train",), {"min_speedup": 3.0})),
))
# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py).
ANSWERS = {"diagnosis": expected_diagnosis, "profile_reading": expected_profile}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_diagnosis", "check_fast_results", "check_fast_technique",
           "check_fit_step", "check_profile_reading", "check_speedup"]
