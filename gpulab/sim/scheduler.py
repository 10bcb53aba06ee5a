"""Running a block of CUDA threads one at a time, with our own books on cuda.syncthreads().

Like the simulator, each CUDA thread is a Python thread. Unlike it, they never run at once:
the scheduler hands a baton to thread 0, which runs until it reaches a barrier or returns,
then to thread 1, and so on; when every thread has stopped, the ones waiting at the barrier
pass it together (their epoch goes up by one) and the next round starts. So:

* a run is deterministic: a racy kernel computes the same (wrong) values every time, and
  every access of one barrier interval (epoch) is logged before any access of the next;
* a barrier that not every thread reaches is seen, not guessed: the simulator's BlockManager
  lets waiting threads go once every *live* thread waits, so a `cuda.syncthreads()` inside
  `if t < 16:`, or after an early `return`, passes silently there. Here it is recorded as a
  DivergentBarrier and then released the same way, so the launch ends with a report;
* a thread that spins on a value another thread of its block will write (a flag) gets
  paused after QUANTUM accesses and resumes after the others have had a turn, as on a GPU;
* nothing hangs: a launch that runs past its time limit raises KernelTimeout, and its threads
  unwind at their next memory access.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque

import numpy as np

from gpulab.sim.device import Dim3
from gpulab.sim.memory import Aborted, Recorder
from gpulab.sim.records import DivergentBarrier, KernelTimeout, OutOfBoundsError, format_coord

NEW, RUNNING, WAITING, PAUSED, DONE, FAILED, ABORTED = range(7)
QUANTUM = 20_000  # accesses a thread may make before it must let the next thread run
_OUR_FILES = ("gpulab/sim/", "numba/cuda/simulator/", "threading.py")


def _user_frame(frame):
    """The first frame, going outwards, that is the kernel's and not ours or Numba's."""
    while frame is not None and any(
            part in frame.f_code.co_filename.replace("\\", "/") for part in _OUR_FILES):
        frame = frame.f_back
    return frame


class KernelThread(threading.Thread):
    """One CUDA thread: the kernel's Python function, run when the scheduler says so."""

    def __init__(self, launch: Launch, target, block: tuple, block_lin: int, thread: tuple,
                 thread_lin: int, block3, thread3):
        super().__init__(daemon=True, name=f"cuda thread {thread} of block {block}")
        self.block, self.thread = block, thread  # as many coordinates as the launch gave
        self.block_lin, self.thread_lin = block_lin, thread_lin
        self.blockIdx = Dim3(*block3)  # what cuda.blockIdx / threadIdx return
        self.threadIdx = Dim3(*thread3)
        self.thread_id = thread_lin  # the simulator's name (cuda.laneid uses it)
        self.epoch = 0  # barriers passed
        self.ordinal = 0  # accesses since the last barrier
        self.turns: dict[int, int] = {}  # loop id -> turns so far (loops.py)
        self.budget = QUANTUM  # accesses left before it pauses for the others
        self.state = NEW
        self.site = None  # (line, file) of the barrier it waits at
        self.vote = 0  # the value given to syncthreads_count / _and / _or
        self.vote_result = None
        self.error: BaseException | None = None
        self._launch = launch
        self._target = target
        self._go = threading.Semaphore(0)

    def run(self):
        self._go.acquire()
        try:
            if self._launch.recorder.aborted:
                raise Aborted
            self._target()
            self.state = DONE
        except Aborted:
            self.state = ABORTED
        except BaseException as exc:  # handed to the launching thread, which re-raises it
            self.error = exc
            self.state = FAILED
        finally:
            self._launch.handback.release()

    def resume(self):
        self.budget = QUANTUM
        self._go.release()

    def pause(self):
        """Called on this thread: give the baton back, carry on when it comes round again."""
        self.state = PAUSED
        self._launch.handback.release()
        self._go.acquire()
        if self._launch.recorder.aborted:
            raise Aborted

    def syncthreads(self, frame=None, vote=0, how=None):
        """Called on this thread by cuda.syncthreads(): stop, let the scheduler decide."""
        frame = _user_frame(frame if frame is not None else sys._getframe(1))
        self.site = (frame.f_lineno, frame.f_code.co_filename) if frame else (0, "")
        self.vote = vote
        self.state = WAITING
        self._launch.handback.release()
        self._go.acquire()
        if self._launch.recorder.aborted:
            raise Aborted
        self.epoch += 1
        self.ordinal = 0
        return self.vote_result[how] if how else None


class Launch:
    """The books of one traced launch: the log, the barrier problems, the time limit."""

    def __init__(self, blocks: tuple, threads_per_block: tuple, timeout_s: float):
        self.blocks = blocks  # as given, 1-3 ints
        self.threads_per_block = threads_per_block
        self.block3 = tuple(blocks) + (1,) * (3 - len(blocks))
        self.thread3 = tuple(threads_per_block) + (1,) * (3 - len(threads_per_block))
        self.recorder = Recorder()
        self.barrier_errors: list[DivergentBarrier] = []
        self.handback = threading.Semaphore(0)
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s

    @staticmethod
    def coords(dims3: tuple, ndim: int) -> list[tuple]:
        """Every (x, y, z) of a 3-D extent, x fastest as CUDA numbers them, cut to ndim."""
        return [tuple(reversed(zyx))[:ndim] for zyx in np.ndindex(*reversed(dims3))]

    def run_block(self, target, block: tuple, block_lin: int, on_new_block) -> None:
        """Run every thread of one block to the end; raise what a thread raised."""
        on_new_block()
        ndim = len(self.threads_per_block)
        threads = [
            KernelThread(self, target, block, block_lin, thread, lin,
                         block + (0,) * (3 - len(block)), thread + (0,) * (3 - ndim))
            for lin, thread in enumerate(self.coords(self.thread3, ndim))]
        for t in threads:
            t.start()
        try:
            runnable = threads
            while runnable:
                queue = deque(runnable)
                while queue:  # one barrier interval: round robin until all stop
                    t = queue.popleft()
                    self._run_until_stop(t)
                    if t.state == PAUSED:
                        queue.append(t)
                runnable = self._pass_barrier(threads, block)
        except BaseException:
            self._abandon(threads)
            raise
        for t in threads:
            t.join()

    def _run_until_stop(self, t: KernelThread) -> None:
        self.recorder.current = t
        t.state = RUNNING
        t.resume()
        if not self.handback.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            raise KernelTimeout(
                f"the traced launch ran past its {self.timeout_s:g} s limit while thread "
                f"{format_coord(t.thread)} of block {format_coord(t.block)} was running: an "
                "endless loop, or a thread spinning on a value another thread writes later? "
                "(raise the limit with run_traced(..., timeout_s=...) if the kernel is just big)")
        if t.state == FAILED:
            exc = t.error
            if hasattr(exc, "add_note") and not isinstance(exc, OutOfBoundsError):  # 3.11+
                exc.add_note(f"(raised by thread {format_coord(t.thread)} of block "
                             f"{format_coord(t.block)})")
            raise exc

    def _pass_barrier(self, threads, block) -> list[KernelThread]:
        """Everyone has stopped: release the threads that wait at a barrier, after noting a
        barrier that some threads skipped or reached at a different line."""
        waiting = [t for t in threads if t.state == WAITING]
        if not waiting:
            return []
        sites = {}
        for t in waiting:
            sites.setdefault(t.site, []).append(t.thread)
        exited = tuple(t.thread for t in threads if t.state == DONE)
        if exited or len(sites) > 1:
            self.barrier_errors.append(DivergentBarrier(
                block=block, barrier=waiting[0].epoch,
                waiting=tuple((line, tuple(ts)) for (line, _), ts in sorted(sites.items())),
                exited=exited))
        votes = [t.vote for t in waiting]
        results = {"count": int(np.count_nonzero(votes)), "and": int(all(votes)),
                   "or": int(any(votes))}
        for t in waiting:  # each picks the answer to the question it asked
            t.vote_result = results
        return waiting

    def _abandon(self, threads) -> None:
        """Unwind every thread that is not running: they raise Aborted when they wake."""
        self.recorder.aborted = True
        for t in threads:
            if t.state in (NEW, WAITING, PAUSED):
                t.state = ABORTED
                t.resume()
        for t in threads:
            t.join(timeout=1.0)
