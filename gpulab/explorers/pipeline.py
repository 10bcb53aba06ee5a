"""Pipeline-schedule explorer: stages p, microbatches m and a schedule; see the bubble.

    ex = pipeline_explorer()                 # 1F1B, p=4, m=8
    ex.result.bubble_fraction                # 3/11: (p-1)/(m+p-1) of all stage-time is idle
    ex.result.peak_in_flight                 # [4, 3, 2, 1]: GPipe would hold 8 on every stage
    ex.set(schedule="interleaved 1F1B", n_chunks=2)      # the bubble halves: 3/19

The schedules are simulated by gpulab.distributed.schedule (a forward costs 1, a backward 2,
no communication time) and drawn by gpulab.distributed.schedule_draw.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

from gpulab.distributed import schedule as sched
from gpulab.explorers.base import Control, Explorer

SCHEDULES = ("GPipe", "1F1B", "interleaved 1F1B")
MAX_TEXT_STEPS = 60  # wider schedules are drawn only, not also printed as a grid


def pipeline_schedule(schedule: str = "1F1B", pp_size: int = 4, n_microbatches: int = 8,
                      n_chunks: int = 2) -> sched.Schedule:
    """The pure function behind the explorer: the simulated Schedule. n_chunks (model chunks per
    device) is used by the interleaved schedule only, which also needs m a multiple of p."""
    if schedule == "GPipe":
        return sched.schedule_gpipe(pp_size, n_microbatches)
    if schedule == "1F1B":
        return sched.schedule_1f1b(pp_size, n_microbatches)
    if schedule == "interleaved 1F1B":
        return sched.schedule_interleaved_1f1b(pp_size, n_microbatches, n_chunks)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def describe_schedule(s: sched.Schedule) -> str:
    v = s.n_chunks
    lines = [  # the summary names the activations each stage holds at its peak
        s.summary(),
        f"bubble: {s.bubble_fraction:.1%} of stage-time idle = (p-1)/(v m + p - 1) = "
        f"{s.pp_size - 1}/{v * s.n_microbatches + s.pp_size - 1}; idle/busy "
        f"{s.bubble_ratio:.1%} = (p-1)/(v m)",
    ]
    steps = s.makespan / min(a.end - a.start for a in s.actions)
    if steps <= MAX_TEXT_STEPS:
        lines.append(s.text())
    return "\n".join(lines)


def draw_schedule(s: sched.Schedule):
    from gpulab.distributed.schedule_draw import draw_schedule as draw

    return draw(s)


def pipeline_explorer(interactive: bool | None = None, **values) -> Explorer:
    """Schedule, pp_size, n_microbatches (and n_chunks for interleaving) -> the timeline, the
    bubble and the activations each stage holds. values: start values of the controls."""
    controls = [
        Control("schedule", "schedule", "1F1B", SCHEDULES),
        Control("pp_size", "stages (p)", 4, (1, 8), kind="slider"),
        Control("n_microbatches", "microbatches (m)", 8, (1, 32), kind="slider"),
        Control("n_chunks", "chunks per device (v)", 2, (2, 4), kind="slider",
                used_when=("schedule", "interleaved 1F1B")),  # GPipe and 1F1B ignore it
    ]
    return Explorer("Pipeline schedules", controls, pipeline_schedule, describe_schedule,
                    draw_schedule, values, interactive)
