"""Interactive explorers for the lessons: move a control, see what the performance model says.

    from gpulab.explorers import roofline_explorer
    roofline_explorer()                        # as a cell's value: widgets, or a static picture
    roofline_explorer(op="softmax", interactive=False).text()

roofline   roofline_explorer: GPU, op, shape, dtype -> FLOP/byte, regime, best time  (Lesson 01)
waves      waves_explorer: GPU, elements, threads per block -> blocks, waves, tail  (Lesson 01)
pipeline   pipeline_explorer: schedule, p, m, v -> timeline, bubble, activations held (Lesson 06)
memory     memory_explorer: model, precision, optimizer, ZeRO, world size, checkpointing
           -> memory per GPU and whether it fits                                    (Lesson 07)
base       Explorer and Control: what they share, and the static fallback (see its docstring)

Each explorer is controls -> a pure function (roofline_point, launch_waves, pipeline_schedule,
memory_plan: call them directly for the numbers) -> a text and a figure. The modules load on
first use; matplotlib and ipywidgets load only when an explorer is drawn.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Control": "base", "Explorer": "base", "widgets_available": "base",
    "roofline_explorer": "roofline", "roofline_point": "roofline",
    "waves_explorer": "waves", "launch_waves": "waves",
    "pipeline_explorer": "pipeline", "pipeline_schedule": "pipeline",
    "memory_explorer": "memory", "memory_plan": "memory",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'gpulab.explorers' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpulab.explorers.{_WHERE[name]}"), name)
