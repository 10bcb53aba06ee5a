"""What every benchmark returns: measured figures and ratios, one row each.

A benchmark file is `benchmarks/bench_<topic>.py` with `run(quick: bool) -> list[Row]`.
Targets are ratios against the obvious alternative measured in the same run, never absolute
times, so a row means the same on a laptop, a CI runner and a GPU server.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One measured figure."""

    benchmark: str  # the file's topic, e.g. "kernels"
    metric: str  # what was measured, e.g. "tiled / naive matmul global bytes"
    value: float
    unit: str  # "x" for ratios, "s", "GB/s", "bytes", ...
    target: str = ""  # the goal as a person reads it, e.g. "<= 1.3x"; empty when only reported
    ok: bool | None = None  # whether the target is met; None when there is no target
    note: str = ""  # context: the device, sizes, why a row was skipped

    def cells(self) -> list[str]:
        status = {True: "ok", False: "MISSED", None: ""}[self.ok]
        return [self.benchmark, self.metric, f"{self.value:.4g} {self.unit}".strip(),
                self.target, status, self.note]
