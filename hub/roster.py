"""Who is in the class in a box: a fixed list of demo accounts, one hub user and one system user
each (the Makefile creates the system users; the hub's own DummyAuthenticator lets only these in).

`python hub/roster.py` prints the names, one a line, for the Makefile.
"""

INSTRUCTORS = ("gpulab-instructor",)
LEARNERS = ("gpulab-ada", "gpulab-grace", "gpulab-alan")

if __name__ == "__main__":
    print("\n".join(INSTRUCTORS + LEARNERS))
