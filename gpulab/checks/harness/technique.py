"""Grading how a kernel gets its answer, not only the answer: a course about speed grades the
technique too, with part of a part's points.

    trace = trace_kernel(kernel, "matmul_tiled", blocks, tpb, c, a, b, bias, case="...")
    trace.bytes_read_by_array["a"]          # what the kernel asked global memory for
    busiest_thread(trace, space="shared")   # ((block, thread), accesses): O(block) work shows
    judge_technique(technique_verdict, kernel, {"seed": 0}, yardstick)

The evidence is the simulator's trace (gpulab.sim), counts that do not depend on the machine:
bytes read per array, sectors per request, accesses per thread, barriers, atomics. A part's
verdict is one function of those counts on both runners: on the cpu runner it traces the kernel
in this process; on the gpu runner in a simulator process of its own (simulator_process.py),
and the kernel's measured speed against a plain version of it is printed beside the verdict,
for information: it is not graded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import gpulab
from gpulab.checks.harness.kernels import kernel_failed, simulator_pace
from gpulab.timing import format_seconds


def trace_kernel(kernel, name: str, blocks, threads_per_block, *args, case: str = ""):
    """gpulab.sim.run_traced on host arrays; an error is an AssertionError that names the kernel
    and the case, as a launch's would."""
    from gpulab.sim import run_traced  # the tracing simulator: loaded only when used

    try:
        with simulator_pace():
            return run_traced(kernel, blocks, threads_per_block, *args)
    except Exception as error:  # the learner's code may raise anything; say what it means
        where = f"{name} ({case}, blocks={blocks}, threads_per_block={threads_per_block})"
        raise kernel_failed(name, where, error) from error


def accesses_per_thread(trace, space: str | None = None, kind: str | None = None,
                        array: str | None = None) -> Counter:
    """(block, thread) linear indices -> accesses it made, of `space`/`kind`/`array` if given."""
    kinds = {"read": 0, "write": 1, "atomic": 2}
    found = Counter()
    for block, thread, aid, _, k, *_ in trace.records:
        info = trace.arrays[aid]
        if ((space is None or info.space == space) and (kind is None or kinds[kind] == k)
                and (array is None or info.name == array)):
            found[block, thread] += 1
    return found


def busiest_thread(trace, **which) -> tuple[tuple[int, int], int]:
    """((block, thread), accesses) of the thread that made the most accesses of that kind."""
    counts = accesses_per_thread(trace, **which)
    return max(counts.items(), key=lambda item: item[1], default=((0, 0), 0))


def require_tree(trace, name: str, case: str, threads: int, reads_per_step: int,
                 hint: str, own_reads: int = 1) -> None:
    """AssertionError unless the kernel works like a tree over the block: no thread reads more
    than its own `own_reads` elements, reads_per_step per step of log2(threads) steps, and one
    more; and the partial results go through shared memory. `hint` (what to do) leads the
    message."""
    steps = max(1, int(math.log2(threads)))
    most = reads_per_step * steps + own_reads + 1
    (block, thread), reads = busiest_thread(trace, kind="read")
    values_right = "The values are right; this is the technique's part."
    if reads > most:
        raise AssertionError(
            f"{hint}: no thread should read more than {most} elements. In {name} ({case}), "
            f"thread {thread} of block {block} read {reads} elements, one by one: O(THREADS) "
            f"work for one thread, where a tree takes log2({threads}) = {steps} steps. "
            + values_right)
    if not trace.shared_bytes_read:
        raise AssertionError(
            f"Keep the partial results in a cuda.shared.array: {name} ({case}) never read "
            "shared memory, and a tree across the block's threads goes through it. "
            + values_right)


def atomics_per_block(trace, space: str = "global") -> Counter:
    """Block linear index -> atomic updates of `space` memory it made."""
    return Counter(block for block, _, aid, _, kind, *_ in trace.records
                   if kind == 2 and trace.arrays[aid].space == space)


@dataclass(frozen=True)
class Yardstick:
    """What the gpu runner times the learner's kernel against, to print beside the verdict."""

    kernel: object  # the course's plain version, a @cuda.jit kernel
    label: str  # what it is, as the printed line names it: "thread 0 adding each block"
    size: str  # the launch both run at, for the printed line: "n=4194304"
    blocks: object  # the learner's kernel's launch ...
    threads_per_block: object
    make_args: Callable[[], tuple]  # ... and fresh device arguments for either kernel
    ref_blocks: object = None  # the plain kernel's launch, when it differs
    ref_threads_per_block: object = None


def judge_technique(verdict, kernel, settings: dict, yardstick: Callable[[], Yardstick]) -> None:
    """The technique's verdict, `verdict(kernel, **settings)`: traced in this process on the cpu
    runner, in a simulator process on the gpu runner, where the kernel's measured speed against
    `yardstick()` is printed first, not graded. AssertionError with the verdict's message."""
    from gpulab.checks.harness.simulator_process import Verdict, verdicts_in_simulator

    if gpulab.runner.simulator:
        verdict(kernel, **settings)
        return
    print(speed_line(kernel, yardstick))
    (failed,) = verdicts_in_simulator([Verdict(verdict, kernel, settings)])
    if failed is not None:
        raise AssertionError(failed)


def speed_line(kernel, yardstick: Callable[[], Yardstick]) -> str:
    """One line: the kernel's measured time and its speed against the yardstick (gpu runner)."""
    try:
        y = yardstick()
        ref = (y.ref_blocks or y.blocks, y.ref_threads_per_block or y.threads_per_block)
        mine = median_kernel_s(kernel, y.blocks, y.threads_per_block, y.make_args)
        plain = median_kernel_s(y.kernel, *ref, y.make_args)
    except Exception as error:  # information only: a failure here costs nothing
        return f"Speed on this GPU not measured ({type(error).__name__}: {error}); not graded."
    return (f"Measured on this GPU, not graded: {format_seconds(mine)} at {y.size}, "
            f"{plain / mine:.2f}x the speed of {y.label}. The grade comes from the trace.")


def median_kernel_s(kernel, blocks, threads_per_block, make_args, repeat: int = 20) -> float:
    """Median seconds of `kernel[blocks, threads_per_block]` on fresh arguments from
    make_args(), timed with CUDA events after one warm-up launch (gpu runner only)."""
    from numba import cuda

    args = make_args()
    kernel[blocks, threads_per_block](*args)  # compile and warm up
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        kernel[blocks, threads_per_block](*args)
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) / 1e3)
    return sorted(times)[len(times) // 2]
