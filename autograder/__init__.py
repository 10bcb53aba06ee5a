"""The course's grading pipeline on top of nbgrader 0.9: `python -m autograder ...`.

course.py       where a course's files live; nbgrader's configuration, built in code
profiles.py     runner profiles (cpu, gpu): the grading kernel's environment, time limits
release.py      labs/LAB from solutions/LAB (nbgrader generate_assignment), drift check
submissions.py  finding learners' submissions and staging copies of them
worker.py       grading one submission in its own process and nbgrader course root
cells.py        a submission's cells: admitted (unreadable, duplicated, deleted), planned
learner.py      whose notebook it is: the student's id in the kernel, a LEARNER naming another
execute.py      running a submission's notebook: integrity checks, restarts, timeouts
integrity.py    the guard in the grading kernel: a snapshot of the test machinery, checked
output_caps.py  bounded outputs per cell and per notebook, as messages arrive
sandbox.py      the grading kernel's sandbox: bubblewrap namespaces, what it may see, limits
jail.py         one kernel's private folders and uid on the host, and ending its processes
sandbox_kernel.py  the kernel's launcher in the sandbox: rlimits, a clean environment, the uid
kernel_manager.py  nbgrader's kernels started in the sandbox (a jupyter_client KernelManager)
scoring.py      how a test cell's outputs become points (only raising fails a test)
gradebook.py    the gradebook's one writer: recording a worker's result, atomically, with a record
pool.py         worker processes N at a time, none outliving the grader
grade.py        grading a batch of submissions on a profile: resumable, `--jobs N`, `--shard i/n`
shards.py       a class split across runners by a stable hash, and merging their grading roots
feedback.py     HTML feedback without hidden tests, their tracebacks or their output
export.py       the grades CSV
cli.py          the command line
"""

import sys

# jsonschema, which nbformat imports, builds an RFC 3987 grammar when it is importable: about
# 3 s of CPU in every grading process (the CLI, each worker). nbformat's schemas check no IRI,
# so the grammar is never used; without it jsonschema only skips its "iri" format checker.
sys.modules.setdefault("rfc3987_syntax", None)
