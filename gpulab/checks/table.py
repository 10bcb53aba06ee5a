"""A graded assignment's parts and points: the one table that progress(), the grading tests and
the instructors' docs read. Each lab package holds its own (gpulab/checks/lab1/__init__.py ...).

    Part("saxpy", 2, Check("check_saxpy", ("saxpy",), {"sizes": [2048, 5000]}))

A Part is one autograded test cell of solutions/<name>/<name>.ipynb: its grade_id ("test_" +
name, or the name itself where the notebook says so, as the quiz's "q07"), its points, and the
checker calls of its VISIBLE half with the learner's definitions named, not copied. Hidden tests
never appear here. tests/test_progress.py parses every test cell and fails when a table and its
notebook drift apart. Nothing here imports torch or numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    """An expected answer by name, as a test cell's `answer_key("lab1.waves")` (keys.py)."""

    name: str


@dataclass(frozen=True)
class Check:
    """One call of a checker in a visible test cell: checker(*learner's names, **kwargs)."""

    checker: str  # a name the assignment's package exports
    args: tuple[str, ...]  # names of the learner's definitions in the notebook, in order
    kwargs: dict = field(default_factory=dict)  # literal keyword arguments (or Answer), as
    # in the cell


@dataclass(frozen=True)
class Part:
    """One autograded part: what its visible test cell runs, and what it is worth."""

    name: str  # progress("lab1", part=name)
    points: float
    checks: tuple[Check, ...] = ()
    grade_id_prefix: str = "test_"  # the quiz's cells are "q07", not "test_q07"

    @property
    def grade_id(self) -> str:
        return f"{self.grade_id_prefix}{self.name}"

    @property
    def names(self) -> tuple[str, ...]:
        """The learner's definitions this part needs, each once, in order of first use."""
        return tuple(dict.fromkeys(n for check in self.checks for n in check.args))


def part(name: str, points: float, *checks: Check) -> Part:
    return Part(name, points, checks)


@dataclass(frozen=True)
class Assignment:
    """One graded notebook: solutions/<name>/<name>.ipynb, released to labs/<name>/."""

    name: str  # "lab1_cuda_kernels"
    parts: tuple[Part, ...]  # the autograded test cells, in notebook order
    manual: tuple[tuple[str, float], ...] = ()  # (grade_id, points) of cells graded by hand

    @property
    def short_name(self) -> str:
        return self.name.split("_", 1)[0]  # "lab1", "quiz", "capstone"

    @property
    def points(self) -> dict[str, float]:
        """Autograded test cell grade_id -> points, in notebook order."""
        return {p.grade_id: p.points for p in self.parts}

    @property
    def total(self) -> float:
        return sum(self.points.values()) + sum(points for _, points in self.manual)
