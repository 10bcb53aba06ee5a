"""What every checker stands on; it knows no lab.

whose.py            is a file the learner's code (a notebook cell, a module of their own)?
owned.py            is the graded kernel, function or class the learner's own, not gpulab's?
short_traceback.py  a checker's failure shown as its message and the learner's line
kernels.py, technique.py   run a learner's kernel (simulator), judge how it moves memory;
                    simulator_process.py: the same verdicts in a simulator process (gpu runner)
ranks.py, calls.py  run a learner's code on ranks; record its torch.distributed calls
training.py, numbers.py    training comparisons; numbers, tolerances and how to print them

Importing the harness (each lab's package does, before a test cell calls a checker) shows
checker failures in the short form in the IPython kernel it runs in, if any: the grading
kernel imports the checkers before its integrity guard's snapshot, so the handler is in it.
The registry (gpulab/checks/__init__.py) imports none of this.
"""

from gpulab.checks.harness.short_traceback import install_in_ipython

install_in_ipython()
