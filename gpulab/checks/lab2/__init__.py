"""Lab 2, debugging a mixed-precision training loop
(solutions/lab2_amp_training/lab2_amp_training.ipynb): its parts and points, and its checkers.

The learner receives a training loop with planted bugs (each answer cell's starting code, kept
in the solution's cell metadata gpulab.starting_code and put in the release by
autograder/release.py) and fixes it. Each checker grades behaviour, never the code's text:

    check_to_device(to_device)                        Part 1  every copy asynchronous
    check_amp_step(amp_step)                          Part 2  an fp32 reference step, with and
                                                              without a GradScaler; overflow
    check_accumulate_gradients(accumulate_gradients)  Part 3  micro-batches of unequal size
    check_resume(snapshot, restore)                   Part 4  a resume that continues exactly
    check_memorize(memorize)                          Part 5  the memorization test

Hints: hints.py (gpulab.hint("lab2", part)).

Taught in: lessons/03_pytorch_on_the_gpu.ipynb
"""

from gpulab.checks.lab2.accumulate_gradients import check_accumulate_gradients
from gpulab.checks.lab2.amp_step import check_amp_step
from gpulab.checks.lab2.memorize import check_memorize
from gpulab.checks.lab2.resume import check_resume
from gpulab.checks.lab2.to_device import check_to_device
from gpulab.checks.table import Assignment, Check, part

ASSIGNMENT = Assignment("lab2_amp_training", (
    part("to_device", 2, Check("check_to_device", ("to_device",))),
    part("amp_step", 4, Check("check_amp_step", ("amp_step",))),
    part("accumulate_gradients", 3, Check("check_accumulate_gradients",
                                          ("accumulate_gradients",), {"sizes": [16, 8, 4]})),
    part("resume", 4, Check("check_resume", ("snapshot", "restore"))),
    part("memorize", 2, Check("check_memorize", ("memorize",))),
))
ANSWERS = {}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_accumulate_gradients", "check_amp_step",
           "check_memorize", "check_resume", "check_to_device"]
