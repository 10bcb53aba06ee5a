"""The profiler's events, boiled down to plain records that the analysis reads.

torch.profiler hands back a tree of FunctionEvents (ops, the ops they call, user annotations,
device kernels). This module keeps what the step breakdown and the regime need:

    Span     a named interval: a step (ProfilerStep#N), a phase ("forward"), a device kernel
    OpCall   one call of an op on the host, with its FLOPs and estimated bytes

Times are in seconds from the start of the trace; kernel times are on the same clock.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.profiling.traffic import moves_data, op_bytes, op_dtype

PHASES = ("data", "forward", "backward", "optimizer")  # labels a step is split into
STEP_PREFIX = "ProfilerStep"  # the profiler's own annotation around each step


@dataclass(frozen=True)
class Span:
    """A named interval on one timeline."""

    name: str
    start_s: float
    end_s: float
    thread: int = 0  # host thread id; 0 for device timelines

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class OpCall:
    """One call of an op on the host, as the profiler recorded it."""

    name: str  # "aten::addmm", "Optimizer.step#AdamW.step", "cudaLaunchKernel", ...
    start_s: float
    end_s: float
    self_s: float  # host time in the op itself, the ops it called excluded
    device_s: float  # device time of the kernels this op launched itself (0 on a CPU)
    flops: float  # FLOPs the profiler counted for this op itself (0 when it counts none)
    thread: int
    outermost: bool = False  # an aten op called from Python, not from inside another aten op
    work_flops: float = 0.0  # outermost ops: FLOPs of the op and every op below it
    work_bytes: float = 0.0  # outermost ops: bytes it moves, estimated (profiling.traffic)
    dtype: str = "fp32"  # roofline column of its first floating-point argument

    @property
    def total_s(self) -> float:
        return self.end_s - self.start_s


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _is_aten(event) -> bool:
    return event.name.startswith("aten::")


def _outermost(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if _is_aten(parent):
            return False
        parent = parent.cpu_parent
    return True


def profiled_events(prof):
    """prof.events(), each with its `input_dtypes`. Before torch 2.12 a FunctionEvent has no
    such field: the dtypes stay on the profiler's kineto events, which share the FunctionEvent's
    id as their correlation id."""
    events = prof.events()
    if events and not hasattr(events[0], "input_dtypes"):
        from torch.autograd import DeviceType

        dtypes = {k.correlation_id(): list(k.dtypes())
                  for k in prof.profiler.kineto_results.events()
                  if k.device_type() == DeviceType.CPU}
        for e in events:
            e.input_dtypes = dtypes.get(e.id, [])
    return events


def _is_annotation(event) -> bool:
    """A record_function range rather than an op. torch before 2.12 lacks activity_type (and
    older ones is_user_annotation): there an annotation is known by the course's own labels."""
    flag = getattr(event, "is_user_annotation", None)
    return bool(flag) if flag is not None else _labelled(event)


def _labelled(event) -> bool:
    return event.name in PHASES or event.name.startswith(STEP_PREFIX)


def _dtypes(event) -> list:
    return getattr(event, "input_dtypes", None) or []  # none known: bytes count as 0


def records_from_events(events):
    """(steps, phases, ops, kernels) from a profiler's events(): lists of Span, Span, OpCall,
    Span. Phases are the outermost PHASES annotations; kernels are device activity (kernels,
    copies, memsets), not the device-side copies of annotations."""
    from torch.autograd import DeviceType

    steps, phases, ops, kernels = [], [], [], []
    for e in events:
        start, end = e.time_range.start / 1e6, e.time_range.end / 1e6  # us -> s
        if e.device_type != DeviceType.CPU:
            # record_function ranges are copied onto the device timeline as annotations
            # ("gpu_user_annotation"): they are not work the device did.
            annotation = (_is_annotation(e) or _labelled(e)
                          or "annotation" in str(getattr(e, "activity_type", "")))
            if not annotation:
                kernels.append(Span(e.name, start, end))
            continue
        if e.name.startswith(STEP_PREFIX):
            steps.append(Span(e.name, start, end, e.thread))
        elif e.name in PHASES and _is_annotation(e):
            inside_phase = False
            parent = e.cpu_parent
            while parent is not None and not inside_phase:
                inside_phase = parent.name in PHASES
                parent = parent.cpu_parent
            if not inside_phase:
                phases.append(Span(e.name, start, end, e.thread))
        else:
            call = dict(name=e.name, start_s=start, end_s=end, self_s=e.self_cpu_time_total / 1e6,
                        device_s=e.self_device_time_total / 1e6, flops=float(e.flops or 0),
                        thread=e.thread)
            if _is_aten(e) and _outermost(e):
                below = list(_descendants(e))
                moved = moves_data(e.name, [d.name for d in below])
                # The FLOPs' dtype is that of the op doing them: under autocast, aten::matmul
                # takes fp32 tensors and its aten::mm runs in bf16.
                doer = max([e, *below], key=lambda d: d.flops or 0)
                call.update(outermost=True,
                            work_flops=float(sum(d.flops or 0 for d in [e, *below])),
                            work_bytes=float(op_bytes(e.name, e.input_shapes, _dtypes(e))
                                             if moved else 0),
                            dtype=op_dtype(_dtypes(doer if doer.flops else e)))
            ops.append(OpCall(**call))
    steps.sort(key=lambda s: s.start_s)
    return steps, phases, ops, kernels


def within(start_s: float, spans) -> Span | None:
    """The span that contains the instant `start_s`, or None."""
    for span in spans:
        if span.start_s <= start_s < span.end_s:
            return span
    return None


def busy_seconds(intervals, window: Span) -> float:
    """Seconds of `window` covered by at least one of `intervals` ((start_s, end_s) pairs):
    overlapping kernels on several streams, or an op and the ops it calls, count once."""
    clipped = sorted((max(a, window.start_s), min(b, window.end_s)) for a, b in intervals)
    covered, reach = 0.0, window.start_s
    for a, b in clipped:
        if b <= reach or b <= a:  # already counted, or wholly outside the window
            continue
        covered += b - max(a, reach)
        reach = b
    return covered
