"""Profiling training steps: where the time goes, and what limits it.

    from gpulab.profiling import profile_steps
    result = profile_steps(model, loader, optimizer, steps=5)
    print(result.phases())             # data / forward / backward / optimizer / other per step
    result.top_ops(10)                 # the ops that took the time (OpStat rows)
    print(result.regime())             # compute-, memory- or overhead-bound, and why
    print(count_transfers(step, model))   # syncs and host-to-device copies per step
    result.export_chrome_trace("trace.json")   # drag into https://ui.perfetto.dev

steps.py    profile_steps, phase (label part of a step), labelled_training_step
result.py   ProfileResult, Phases, OpStat: the step breakdown and the top ops
regime.py   Regime and classify: the step against the machine's roofline
transfers.py  count_transfers, Transfers: host-device syncs and copies per step, counted
trace.py    the profiler's events as plain records (Span, OpCall)
traffic.py  bytes each op moves, estimated from its shapes and dtypes
reports.py  Nsight Systems / Nsight Compute reports as records, and the shipped examples

Taught in: lessons/08_profiling_and_optimization.ipynb, Lab 4 (speed up a slow pipeline)
"""

from gpulab.profiling.regime import BUSY_MIN, OP_OVERHEAD_S, SOL_MIN, Regime, classify
from gpulab.profiling.reports import (
    NcuKernel,
    NsysRow,
    example_report,
    example_reports,
    read_ncu_report,
    read_nsys_api_summary,
    read_nsys_kernel_summary,
)
from gpulab.profiling.result import OpStat, Phases, ProfileResult
from gpulab.profiling.steps import labelled_training_step, phase, profile_steps
from gpulab.profiling.trace import PHASES, OpCall, Span
from gpulab.profiling.transfers import Transfers, count_transfers

__all__ = ["BUSY_MIN", "OP_OVERHEAD_S", "PHASES", "SOL_MIN", "OpCall", "OpStat", "Phases",
           "ProfileResult", "Regime", "Span", "Transfers", "classify", "count_transfers",
           "labelled_training_step", "phase", "profile_steps",
           # reports.py
           "NcuKernel", "NsysRow", "example_report", "example_reports", "read_ncu_report",
           "read_nsys_api_summary", "read_nsys_kernel_summary"]
