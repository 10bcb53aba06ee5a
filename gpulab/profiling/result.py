"""What profile_steps found: the trace, the top ops, the step split into phases, the regime.

    result = profile_steps(model, loader, optimizer, steps=5)
    result.phases()                    # data / forward / backward / optimizer / other, per step
    result.top_ops(10)                 # the ops that took the time
    result.regime()                    # compute-, memory- or overhead-bound, and why
    result.export_chrome_trace("step.json")   # open in https://ui.perfetto.dev
    print(result.summary())

Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.profiling.trace import PHASES, OpCall, Span, busy_seconds, within
from gpulab.timing import format_seconds


@dataclass(frozen=True)
class OpStat:
    """One row of top_ops: an op's calls and times, summed over all the profiled steps."""

    name: str
    calls: int
    self_s: float  # host time in the op itself, the ops it called excluded
    total_s: float  # host time including the ops it called
    device_s: float  # device time of the kernels it launched itself (0 on a CPU)
    flops: float  # FLOPs the profiler counted for it (0: it counts none for this op)


@dataclass(frozen=True)
class Phases:
    """Where one step's time goes, in seconds, averaged over the profiled steps."""

    step_s: float  # wall time of a step, from one ProfilerStep mark to the next
    data_s: float  # getting the batch: the loader, collation, the copy to the device
    forward_s: float  # the model and the loss
    backward_s: float  # loss.backward()
    optimizer_s: float  # optimizer.step(), zero_grad, gradient clipping, the scaler
    other_s: float  # the rest: code outside the labelled phases, waiting, profiler bookkeeping
    steps: int  # how many steps were averaged

    def as_dict(self) -> dict[str, float]:
        """{"data": s, "forward": s, "backward": s, "optimizer": s, "other": s}."""
        return {name: getattr(self, f"{name}_s") for name in (*PHASES, "other")}

    def shares(self) -> dict[str, float]:
        """Each phase's fraction of the step; they add up to 1."""
        return {name: s / self.step_s for name, s in self.as_dict().items()}

    def largest(self) -> str:
        """The phase that takes the most time: the first place to look."""
        parts = self.as_dict()
        return max(parts, key=parts.get)

    def __str__(self) -> str:
        lines = [f"step {format_seconds(self.step_s)} (mean of {self.steps})"]
        for name, s in self.as_dict().items():
            lines.append(f"  {name:<10}{format_seconds(s):>10}  {s / self.step_s:6.1%}")
        return "\n".join(lines)


@dataclass
class ProfileResult:
    """The profiled steps of one run, as plain records (see gpulab.profiling.trace)."""

    device: str  # torch device type the steps ran on: "cuda" or "cpu"
    steps: list[Span]  # one per profiled step (ProfilerStep#N)
    phase_spans: list[Span]  # labelled phases inside the steps
    ops: list[OpCall]  # every op call on the host
    kernels: list[Span] = field(default_factory=list)  # device activity (empty on a CPU)
    trace_json: str | None = field(default=None, repr=False)  # the Chrome trace, as exported
    roofline: object = field(default=None, repr=False)  # set by regime() when first measured

    def __post_init__(self):
        if not self.steps:
            raise ValueError("no profiled steps: run at least one step after the warm-up")

    def __repr__(self) -> str:
        return (f"ProfileResult({self.device}, {len(self.steps)} steps of "
                f"{format_seconds(self.phases().step_s)}, {len(self.ops)} op calls)")

    @property
    def step_times_s(self) -> list[float]:
        """Wall time of each profiled step."""
        return [s.duration_s for s in self.steps]

    # --- what took the time -------------------------------------------------------------------

    def top_ops(self, n: int = 10, by: str | None = None) -> list[OpStat]:
        """The `n` ops with the most self time over all profiled steps: device time on a GPU
        (by="device_s"), host time on a CPU (by="self_s"). Phase labels and step marks are not
        ops; the profiler's other annotations (Optimizer.step#AdamW.step) are listed."""
        by = by or ("device_s" if self.device == "cuda" else "self_s")
        if by not in ("self_s", "total_s", "device_s", "flops", "calls"):
            raise ValueError(f"by must name an OpStat field, got {by!r}")
        acc = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
        for op in self.ops_in_steps():
            row = acc[op.name]
            row[0] += 1
            row[1] += op.self_s
            row[2] += op.total_s
            row[3] += op.device_s
            row[4] += op.flops
        stats = [OpStat(name, *row) for name, row in acc.items()]
        return sorted(stats, key=lambda s: getattr(s, by), reverse=True)[:n]

    def phases(self) -> Phases:
        """The mean step split into data loading, forward, backward, optimizer and other time.
        The labels come from record_function ranges named after PHASES (profiling.phase)."""
        per_phase = dict.fromkeys(PHASES, 0.0)
        for span in self.phase_spans:
            if within(span.start_s, self.steps) is not None:
                per_phase[span.name] += span.duration_s
        n = len(self.steps)
        step_s = sum(self.step_times_s) / n
        parts = {name: s / n for name, s in per_phase.items()}
        other = max(step_s - sum(parts.values()), 0.0)
        return Phases(step_s=step_s, **{f"{k}_s": v for k, v in parts.items()}, other_s=other,
                      steps=n)

    def busy_fraction(self) -> float:
        """Fraction of the steps' wall time the device was working. On a GPU: some kernel or
        copy was running. On a CPU: the stepping thread was inside an op (not in Python, not
        waiting for data); this is as close as a CPU gets to "the device was busy"."""
        total = sum(self.step_times_s)
        covered = 0.0
        for step in self.steps:
            if self.device == "cuda":
                intervals = [(k.start_s, k.end_s) for k in self.kernels]
            else:
                intervals = [(op.start_s, op.end_s) for op in self.ops
                             if op.outermost and op.thread == step.thread]
            covered += busy_seconds(intervals, step)
        return covered / total

    def regime(self, roofline=None, op_overhead_s: float | None = None):
        """Compute-, memory- or overhead-bound, with the reasoning (a Regime).

        roofline: a GPUSpec, a MeasuredRoofline or a spec-sheet name. By default, this
        machine's: the spec-sheet row of a CUDA GPU, or ceilings measured here on a CPU (about
        a second, done once per result). See gpulab.profiling.regime."""
        from gpulab.profiling.regime import classify, default_roofline

        if roofline is None:
            if self.roofline is None:
                self.roofline = default_roofline(self)
            roofline = self.roofline
        return classify(self, roofline, op_overhead_s)

    def ops_in_steps(self) -> list[OpCall]:
        """The op calls made during the profiled steps."""
        return [op for op in self.ops if within(op.start_s, self.steps) is not None]

    # --- output -------------------------------------------------------------------------------

    def export_chrome_trace(self, path) -> Path:
        """Write the trace as Chrome trace JSON (gzipped when `path` ends in .gz). Open it in
        https://ui.perfetto.dev (drag the file in) or chrome://tracing."""
        if self.trace_json is None:
            raise ValueError("this result holds no trace (it was built from records)")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(self.trace_json)
        else:
            path.write_text(self.trace_json, encoding="utf-8")
        return path

    def summary(self, n: int = 10, roofline=None) -> str:
        """Phases, the top `n` ops and the regime, as text to print."""
        lines = [str(self.phases()), "", f"top {n} ops over {len(self.steps)} steps:",
                 f"  {'op':<44}{'calls':>7}{'self':>11}{'total':>11}"
                 f"{'device':>11}{'GFLOP':>9}"]
        for op in self.top_ops(n):
            lines.append(f"  {op.name[:43]:<44}{op.calls:>7}{format_seconds(op.self_s):>11}"
                         f"{format_seconds(op.total_s):>11}{format_seconds(op.device_s):>11}"
                         f"{op.flops / 1e9:>9.3g}")
        lines += ["", str(self.regime(roofline))]
        return "\n".join(lines)

    def plot_phases(self, title: str | None = None):
        """A horizontal bar of the mean step, one colour per phase (a matplotlib Figure)."""
        from matplotlib.figure import Figure

        phases = self.phases()
        fig = Figure(figsize=(8, 2.2), dpi=90)
        ax = fig.subplots()
        left = 0.0
        for name, s in phases.as_dict().items():
            ms = s * 1e3
            ax.barh(0, ms, left=left, label=f"{name} {s / phases.step_s:.0%}",
                    color="lightgrey" if name == "other" else None)
            left += ms
        ax.set_yticks([])
        ax.set_xlabel("ms per step")
        ax.set_title(title or f"one step on {self.device}: {format_seconds(phases.step_s)}")
        ax.legend(ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.6), frameon=False)
        fig.subplots_adjust(bottom=0.5, top=0.85)
        return fig
