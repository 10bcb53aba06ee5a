"""The visible checks of every lab, part by part, as the lab's test cells call them.

Each Part is one autograded test cell of solutions/<lab>/<lab>.ipynb: its grade_id, its points and
the checker calls of its VISIBLE half, with the learner's definitions named, not copied. Hidden
tests never appear here. tests/test_progress.py parses every lab's test cells and fails when
this table and the notebooks drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Check:
    """One call of a checker in a visible test cell: checker(*learner's names, **kwargs)."""

    checker: str  # a name in gpulab.checks
    args: tuple[str, ...]  # names of the learner's definitions in the notebook, in order
    kwargs: dict = field(default_factory=dict)  # literal keyword arguments, as in the cell


@dataclass(frozen=True)
class Part:
    """One autograded part of a lab: what its visible test cell runs, and what it is worth."""

    name: str  # the test cell's grade_id without "test_": progress("lab1", part=name)
    points: float
    checks: tuple[Check, ...]

    @property
    def grade_id(self) -> str:
        return f"test_{self.name}"

    @property
    def names(self) -> tuple[str, ...]:
        """The learner's definitions this part needs, each once, in order of first use."""
        return tuple(dict.fromkeys(n for check in self.checks for n in check.args))


def _part(name: str, points: float, *checks: Check) -> Part:
    return Part(name, points, checks)


_TP_LAYERS = ("CopyToTP", "ReduceFromTP", "ColumnParallelLinear", "RowParallelLinear")

LABS: dict[str, tuple[Part, ...]] = {
    "lab1_cuda_kernels": (
        _part("saxpy", 2, Check("check_saxpy", ("saxpy",), {"sizes": [2048, 5000]})),
        _part("transpose", 2, Check("check_transpose", ("transpose",),
                                    {"shapes": [(8, 24), (13, 21)]})),
        _part("block_sum", 3, Check("check_block_sum", ("block_sum",), {"sizes": [256, 1000]})),
        _part("matmul_tiled", 4, Check("check_matmul_tiled", ("matmul_tiled",),
                                       {"shapes": [(8, 16, 8), (13, 21, 10)]})),
        _part("histogram", 3, Check("check_histogram", ("histogram",), {"sizes": [1000, 4096]})),
        _part("waves", 2, Check("check_waves", ("n_waves", "tail_utilization", "utilization"),
                                {"gpu": "A100", "n_blocks": 1000, "blocks_per_sm": 4})),
    ),
    "lab2_amp_training": (
        _part("to_device", 2, Check("check_to_device", ("to_device",))),
        _part("amp_step", 4, Check("check_amp_step", ("amp_step",))),
        _part("accumulate_gradients", 3, Check("check_accumulate_gradients",
                                               ("accumulate_gradients",), {"sizes": [16, 8, 4]})),
        _part("resume", 4, Check("check_resume", ("snapshot", "restore"))),
        _part("memorize", 2, Check("check_memorize", ("memorize",))),
    ),
    "lab3_ddp_from_scratch": (
        _part("ring_all_reduce", 6, Check("check_ring_all_reduce", ("ring_all_reduce",),
                                          {"world_sizes": (2, 3), "sizes": (7, 1000)})),
        _part("simple_ddp", 3, Check("check_simple_ddp", ("SimpleDDP",), {"world_sizes": (2,)})),
        _part("fast_ddp", 7, Check("check_fast_ddp", ("FastDDP", "make_buckets"),
                                   {"world_size": 2})),
        _part("train_ddp", 4, Check("check_train_ddp", ("train_ddp",), {"world_sizes": (2, 4)})),
    ),
    "lab4_memory_and_profiling": (
        _part("diagnosis", 3, Check("check_diagnosis",
                                    ("DOMINANT_CATEGORY", "DOMINANT_SHARE", "TIMES_MODEL_STATES"))),
        _part("fit_step", 5, Check("check_fit_step", ("fit_step",))),
        _part("fast_results", 2, Check("check_fast_results", ("fast_train",))),
        _part("speedup", 4, Check("check_speedup", ("fast_train",), {"min_speedup": 3.0})),
    ),
    "lab5_parallelism_across_nodes": (
        _part("tp_linear", 4, Check("check_tp_linear", _TP_LAYERS, {"tp": 2})),
        _part("tp_mlp", 3, Check("check_tp_mlp", ("TPMLP",), {"tp": 2})),
        _part("one_f_one_b", 4,
              Check("check_one_f_one_b", ("one_f_one_b_stage",), {"p": 4, "m": 8}),
              Check("check_one_f_one_b", ("one_f_one_b_stage",), {"p": 2, "m": 3})),
        _part("pp_tp_cluster", 5, Check(
            "check_pp_tp_cluster",
            ("pp_tp_step", "TPMLP", *_TP_LAYERS, "one_f_one_b_stage"),
            {"nodes": 2, "procs_per_node": 2, "n_microbatches": 4})),
    ),
}


def find_lab(lab: str) -> str:
    """The full name of `lab`, given as "lab1", "lab1_cuda_kernels" or 1."""
    key = str(lab).strip().lower()
    if key.isdigit():
        key = f"lab{key}"
    found = [name for name in LABS if name == key or name.split("_", 1)[0] == key]
    if len(found) != 1:
        raise ValueError(f"no lab {lab!r}: choose one of {', '.join(LABS)} (or lab1 ... lab5).")
    return found[0]


def find_parts(lab: str, part: str | None = None) -> tuple[Part, ...]:
    """Every part of `lab`, or the one named `part` (its name, or its test cell's grade_id)."""
    parts = LABS[find_lab(lab)]
    if part is None:
        return parts
    wanted = part.removeprefix("test_")
    chosen = tuple(p for p in parts if p.name == wanted)
    if not chosen:
        raise ValueError(f"{lab} has no part {part!r}: its parts are "
                         f"{', '.join(p.name for p in parts)}.")
    return chosen
