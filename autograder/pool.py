"""Grading workers side by side: `python -m autograder.worker` subprocesses, `jobs` at a time.

Each submission is graded by a worker process of its own (autograder/worker.py). This module
starts them, at most `jobs` at once, hands their results back in the order of the tasks (so a
batch is recorded in the same order whatever `jobs` is), and makes sure none outlives the
grader:

    grader killed (SIGKILL, a cancelled CI job)   Linux sends each worker SIGKILL: the worker
                        asks for it (PR_SET_PDEATHSIG) before its Python starts, see LIFELINE
    Ctrl-C, a timeout   the worker's whole process tree is killed here, before returning
    what escaped        a kernel orphaned by its worker's death, a learner's stray daemon: it
                        carries the worker's scratch folder in its environment (SCRATCH_TAG) or
                        as its working directory, and `kill_leftovers` ends it, after each
                        worker and at the start of the next run on the same grading root

The pool's threads do no work of their own: each one waits on a subprocess, so results reach
the one thread that records them (autograder/grade.py) and the gradebook has a single writer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict
from pathlib import Path

from autograder.profiles import RunnerProfile
from autograder.worker import GradeResult, GradeTask

WORKER_LOG_TAIL = 2000  # characters of a crashed worker's stderr kept in its error
SCRATCH_TAG = "AUTOGRADER_SCRATCH"  # environment variable: the worker's scratch folder

# Run as `python -c LIFELINE GRADER_PID COMMAND...`: ask Linux to SIGKILL this process when the
# grader's thread that started it ends, then become the worker (execv keeps the request). The
# parent check closes the window in which the grader died before the request was made.
LIFELINE = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit("the grader exited before this worker started")
os.execv(sys.argv[2], sys.argv[2:])
"""


def worker_command(task_file: Path, result_file: Path) -> list[str]:
    """The command that grades one task; on Linux it dies with the grader."""
    command = [sys.executable, "-m", "autograder.worker", str(task_file), str(result_file)]
    if not sys.platform.startswith("linux"):  # no PR_SET_PDEATHSIG: kill_leftovers still runs
        return command
    return [sys.executable, "-c", LIFELINE, str(os.getpid()), *command]


def kill_tree(pid: int) -> None:
    """SIGKILL process `pid`, its process group and every descendant (a kernel has a session
    of its own, so killing the worker's group alone would leave it running)."""
    import psutil

    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:  # gone already, or not a group leader
            pass
    for process in descendants:
        try:
            process.kill()
        except psutil.Error:
            pass


def kill_leftovers(folder: Path) -> int:
    """SIGKILL every process that belongs to a worker scratch folder under `folder`: tagged
    with it (SCRATCH_TAG) or working inside it. Returns how many there were."""
    import psutil

    folder = Path(folder).resolve()
    me = psutil.Process()
    spared = {me.pid, *(parent.pid for parent in me.parents())}  # a shell cd'ed in there
    found = []
    for process in psutil.process_iter():
        if process.pid in spared:
            continue
        try:
            tag, cwd = process.environ().get(SCRATCH_TAG), process.cwd()
        except psutil.Error:  # exited meanwhile, a zombie, or not ours to read
            continue
        if any(p and Path(p).is_relative_to(folder) for p in (tag, cwd)):
            found.append(process)
    for process in found:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=5)
    return len(found)


# How often the grader's main thread wakes while it waits for a worker. Linux may deliver a
# Ctrl-C to any thread: to a grading thread blocked in waitpid, it leaves the main thread asleep
# in its wait, and the KeyboardInterrupt would come only once that submission is graded (a
# learner's sleeping kernel: minutes). Waking runs the pending handler.
WAKE_S = 0.2


def _result(future: Future):
    """future.result(), in short waits, so that a pending Ctrl-C is raised within WAKE_S."""
    while True:
        try:
            return future.result(timeout=WAKE_S)
        except FutureTimeout:
            continue


class WorkerPool:
    """Grade tasks with at most `jobs` worker processes at once; use as a context manager.

    Leaving the `with` block early (Ctrl-C, an error while recording) kills the workers still
    running and cancels the tasks not started.
    """

    def __init__(self, profile: RunnerProfile, jobs: int = 1):
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, not {jobs}")
        self.profile = profile
        self._executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grading")
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen] = {}  # pid -> worker still running
        self._stopping = False

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def map(self, tasks: list[GradeTask]) -> Iterator[GradeResult]:
        """Each task's result in the order of `tasks`, once it and those before it are done."""
        futures = [self._executor.submit(self.run, task) for task in tasks]
        for future in futures:
            yield _result(future)

    def stop(self) -> None:
        """Start no more workers, and kill those running."""
        with self._lock:
            self._stopping = True
            running = list(self._running.values())
        for process in running:
            kill_tree(process.pid)

    def run(self, task: GradeTask) -> GradeResult:
        """Grade one task in a worker subprocess, with the profile's kernel environment."""
        scratch = Path(task.workdir).parent
        scratch.mkdir(parents=True, exist_ok=True)
        task_file, result_file = scratch / "task.json", scratch / "result.json"
        task_file.write_text(json.dumps(asdict(task), indent=1))
        env = self.profile.kernel_env(os.environ)
        env[SCRATCH_TAG] = str(scratch.resolve())  # the worker's kernel inherits it
        # Output to a file, not a pipe: the kernel inherits it, and a learner may print a lot.
        with open(scratch / "worker.log", "w+b") as log:
            with self._lock:
                if self._stopping:
                    return GradeResult(task.lab, task.student_id, error="grading was stopped")
                # Its own session: a Ctrl-C at the terminal is the grader's to handle, and a
                # timeout kills the worker's group.
                process = subprocess.Popen(
                    worker_command(task_file, result_file),
                    env=env,
                    cwd=scratch,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self._running[process.pid] = process
            try:
                process.wait(timeout=self.profile.submission_timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                kill_tree(process.pid)
                process.wait()
                timed_out = True
            finally:
                with self._lock:
                    self._running.pop(process.pid, None)
            kill_leftovers(scratch)  # whatever the learner's code left behind
            if timed_out:
                limit = self.profile.submission_timeout_s
                error = f"grading ran past {limit} s and was stopped"
                return GradeResult(task.lab, task.student_id, error=error)
            if result_file.is_file():
                return GradeResult.from_json(result_file.read_text())
            log.seek(max(0, log.seek(0, os.SEEK_END) - WORKER_LOG_TAIL))
            tail = log.read().decode("utf-8", "replace")
        error = f"the grading worker exited with status {process.returncode}:\n{tail}"
        return GradeResult(task.lab, task.student_id, error=error)
