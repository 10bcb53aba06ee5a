"""nbgrader's configuration for every JupyterLab the class hub starts (hub/jupyterhub_config.py
passes the places in the environment): the course, the shared exchange and, for an instructor,
the grading root that `python -m autograder` fills."""

import os

c = get_config()  # noqa: F821 (traitlets defines it when it runs this file)
c.CourseDirectory.course_id = "gpulab"
c.Exchange.root = os.environ["GPULAB_EXCHANGE"]
if os.environ.get("GPULAB_COURSE_DIR"):  # the instructor's formgrader reads the grading root
    c.CourseDirectory.root = os.environ["GPULAB_COURSE_DIR"]
