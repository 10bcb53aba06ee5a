"""What a traced launch reports: one memory access, a race between two of them, a barrier that
not every thread reached, and the errors a checker raises.

Threads and blocks are tuples with as many coordinates as the launch gave them:
`kernel[4, 32]` gives blocks (b,) and threads (t,); `kernel[(2, 2), (16, 16)]` gives (x, y).
Taught in: lessons/02_cuda_with_numba.ipynb
"""

from __future__ import annotations

from dataclasses import dataclass

READ, WRITE, ATOMIC = "read", "write", "atomic"


def format_coord(coord: tuple[int, ...]) -> str:
    """(3,) -> "3", (1, 2) -> "(1, 2)": a 1-D index reads as a plain number."""
    return str(coord[0]) if len(coord) == 1 else str(tuple(coord))


def format_index(array: str, index: tuple[int, ...]) -> str:
    """("C", (1, 2)) -> "C[1, 2]"."""
    return f"{array}[{', '.join(str(i) for i in index)}]"


def format_interval(epoch: int) -> str:
    """Where a barrier interval sits: 0 -> "before the first cuda.syncthreads()"."""
    if epoch == 0:
        return "before the first cuda.syncthreads()"
    return f"between cuda.syncthreads() #{epoch} and the next"


def format_threads(threads, limit: int = 4) -> str:
    """Many threads in a few words: "threads 0-15", "threads (0, 1), (1, 1) and 14 more"."""
    threads = sorted(threads, key=lambda c: tuple(reversed(c)))  # x fastest, like CUDA
    if not threads:
        return "no threads"
    if len(threads[0]) == 1:  # 1-D: compress runs of neighbours into ranges
        ids = [c[0] for c in threads]
        runs = []
        start = prev = ids[0]
        for cur in ids[1:] + [None]:
            if cur is not None and cur == prev + 1:
                prev = cur
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = cur
        word = "thread" if len(ids) == 1 else "threads"
        more = f" and {len(runs) - limit} more ranges" if len(runs) > limit else ""
        return f"{word} {', '.join(runs[:limit])}{more}"
    shown = ", ".join(format_coord(c) for c in threads[:limit])
    rest = len(threads) - limit
    word = "thread" if len(threads) == 1 else "threads"
    return f"{word} {shown}" + (f" and {rest} more" if rest > 0 else "")


@dataclass(frozen=True)
class Access:
    """One read, write or atomic update of one array element by one CUDA thread."""

    block: tuple[int, ...]  # blockIdx, as many coordinates as the launch's `blocks`
    thread: tuple[int, ...]  # threadIdx, as many coordinates as `threads_per_block`
    space: str  # "global" (a kernel argument) or "shared" (cuda.shared.array)
    array: str  # the kernel parameter's name, or the shared array's variable name
    index: tuple[int, ...]  # the element, in the array's own shape
    kind: str  # "read", "write" or "atomic"
    epoch: int  # how many cuda.syncthreads() this thread had passed
    line: int  # source line of the access (a line of the kernel or of a device function)
    code: str = ""  # that line's text, stripped, for messages
    file: str = ""  # the file the line is in

    def who(self) -> str:
        """ "thread 3 of block 0" """
        return f"thread {format_coord(self.thread)} of block {format_coord(self.block)}"

    def where(self) -> str:
        """ "line 12 (`x[i] = 0`)" """
        return f"line {self.line}" + (f" (`{self.code}`)" if self.code else "")

    def __str__(self) -> str:
        return (f"{self.who()} {self.kind}s {self.space} {format_index(self.array, self.index)}"
                f" on {self.where()}, {format_interval(self.epoch)}")


@dataclass(frozen=True)
class Race:
    """Two accesses to one element by different threads, at least one of them a plain write,
    with nothing that orders them (no barrier between them, or different blocks).

    `first` is the access that comes earlier in the program (its position after the thread's
    last barrier), ties broken by launch order; `kind` is "<first.kind>-<second.kind>", so
    "write-read" is a read that may see the value before the write, "read-write" a write that
    may overwrite a value before another thread has read it, "write-write" two writes."""

    array: str  # the array's name, as in Access.array
    space: str  # "global" or "shared"
    index: tuple[int, ...]  # the element both threads touch
    kind: str  # "write-read", "read-write", "write-write", "write-atomic" or "atomic-write"
    first: Access  # the access the program reaches first
    second: Access  # the access it races with
    # Both threads read AND write this element on that line (`x[i] += 1` by many threads): a
    # lost update, fixed by an atomic. False for `c[t] += c[t + s]`, where one thread reads the
    # element another writes: a missing barrier.
    lost_update: bool = False

    @property
    def threads(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.first.thread, self.second.thread

    @property
    def blocks(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.first.block, self.second.block

    @property
    def lines(self) -> tuple[int, int]:
        return self.first.line, self.second.line

    @property
    def same_block(self) -> bool:
        return self.first.block == self.second.block

    def __str__(self) -> str:
        order = (f"both {format_interval(self.first.epoch)}" if self.same_block
                 else "in different blocks, which nothing orders within one launch")
        return (f"{self.kind} race on {self.space} {format_index(self.array, self.index)}: "
                f"{self.first.who()} {self.first.kind}s it on {self.first.where()} and "
                f"{self.second.who()} {self.second.kind}s it on {self.second.where()}, {order}")


@dataclass(frozen=True)
class DivergentBarrier:
    """A cuda.syncthreads() that not every thread of the block reached together: some threads
    had returned, or threads waited at different syncthreads() calls. On a GPU that is undefined
    behavior (a hang or wrong results); the simulator quietly lets the waiting threads go."""

    block: tuple[int, ...]  # the block
    barrier: int  # how many barriers the waiting threads had passed before this one
    waiting: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]  # (line, threads waiting there)
    exited: tuple[tuple[int, ...], ...]  # threads that had finished the kernel instead

    @property
    def lines(self) -> tuple[int, ...]:
        return tuple(line for line, _ in self.waiting)

    def __str__(self) -> str:
        nth = self.barrier + 1
        at = "; ".join(f"{format_threads(ts)} wait at the cuda.syncthreads() on line {line}"
                       for line, ts in self.waiting)
        text = f"divergent barrier in block {format_coord(self.block)} (barrier #{nth}): {at}"
        if self.exited:
            text += f", but {format_threads(self.exited)} finished the kernel without it"
        return text


class RaceError(AssertionError):
    """A kernel has data races or divergent barriers; the message says where and what to try."""

    def __init__(self, message: str, races=(), barrier_errors=()):
        super().__init__(message)
        self.races = list(races)
        self.barrier_errors = list(barrier_errors)


class OutOfBoundsError(IndexError):
    """A thread indexed past the end of an array. On a GPU nothing stops it: the write lands in
    another buffer or the kernel crashes later with an illegal-address error."""


class KernelTimeout(RuntimeError):
    """A traced launch ran past its time limit (an endless loop, or a thread spinning on a value
    that another thread would only write later)."""
