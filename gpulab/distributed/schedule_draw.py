"""The picture of a pipeline schedule: one row per stage, time to the right.

    from gpulab.distributed.schedule import schedule_1f1b
    from gpulab.distributed.schedule_draw import draw_schedule
    draw_schedule(schedule_1f1b(4, 8))          # a matplotlib Figure, shown as the cell's value

Forwards are blue, backwards green, each box labelled with its microbatch (and chunk letter a,
b, ... when a device holds several chunks; later chunks are darker). Grey is idle: the bubble.
matplotlib is imported when drawing, not when gpulab is.
Taught in: lessons/06_model_pipeline_tensor_parallelism.ipynb
"""

from __future__ import annotations

_FORWARD = ("#8ecae6", "#219ebc", "#126782", "#0b3c49")  # chunk 0, 1, 2, 3+
_BACKWARD = ("#b5e48c", "#76c893", "#34a0a4", "#1a759f")
_IDLE = "#e5e5e5"


def draw_schedule(schedule, ax=None, title: str | None = None):
    """Draw `schedule` (a Schedule) on `ax`, or on a new Figure; return the Figure."""
    from matplotlib.patches import Patch, Rectangle

    p = schedule.pp_size
    span = schedule.makespan
    if ax is None:
        from matplotlib.figure import Figure

        from gpulab.viz import DPI

        n_steps = span / min(a.end - a.start for a in schedule.actions)
        fig = Figure(figsize=(min(16.0, 2.0 + 0.28 * n_steps), 0.9 + 0.45 * p), dpi=DPI)
        ax = fig.subplots()
    fig = ax.figure
    for s in range(p):  # the whole row in grey first: whatever stays grey is idle
        ax.add_patch(Rectangle((0, s - 0.4), span, 0.8, color=_IDLE, lw=0))
    for a in schedule.actions:
        colors = _FORWARD if a.kind == "F" else _BACKWARD
        color = colors[min(a.chunk, len(colors) - 1)]
        ax.add_patch(Rectangle((a.start, a.stage - 0.4), a.end - a.start, 0.8, facecolor=color,
                               edgecolor="white", lw=1))
        label = a.label(schedule.n_chunks)[1:]  # the microbatch (and chunk letter)
        ax.text((a.start + a.end) / 2, a.stage, label, ha="center", va="center",
                fontsize=8, color="white" if a.chunk >= 1 else "black")
    ax.set_xlim(0, span)
    ax.set_ylim(p - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_xlabel("time")
    ax.legend(handles=[Patch(color=_FORWARD[0], label="forward"),
                       Patch(color=_BACKWARD[0], label="backward"),
                       Patch(color=_IDLE, label="idle")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title is None:
        title = (f"{schedule.name}, p={p}, m={schedule.n_microbatches}: bubble "
                 f"{schedule.bubble_fraction:.1%} of stage-time, peak in flight "
                 f"{max(schedule.peak_in_flight)}"
                 + (" microbatch-chunks" if schedule.n_chunks > 1 else ""))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
