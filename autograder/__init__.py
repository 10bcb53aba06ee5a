"""The course's grading pipeline on top of nbgrader 0.9: `python -m autograder ...`.

course.py       where a course's files live; nbgrader's configuration, built in code
profiles.py     runner profiles (cpu, gpu): the grading kernel's environment, time limits
release.py      labs/LAB from solutions/LAB (nbgrader generate_assignment), drift check
submissions.py  finding learners' submissions and staging copies of them
worker.py       grading one submission in its own process and nbgrader course root
scoring.py      how a test cell's outputs become points (only raising fails a test)
gradebook.py    the gradebook's one writer: recording a worker's result
grade.py        grading a batch of submissions on a profile
feedback.py     HTML feedback without hidden tests, their tracebacks or their output
export.py       the grades CSV
cli.py          the command line
"""
