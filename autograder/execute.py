"""Running a submission for grading: nbgrader's Execute, made to distrust the notebook it runs.

autograde runs `GradeExecute` where nbgrader runs its Execute (worker.autograde_config). It runs
the same cells, in order, in one kernel, and adds:

    integrity    before each test cell the kernel's integrity guard (autograder/integrity.py)
                 compares the test machinery with its snapshot; if anything changed, the test is
                 never sent to the kernel: it gets an IntegrityError (zero) and the submission a
                 flag. After the test the guard looks again (a function the checker called may
                 have tampered) and forgets the test's source. Test cells run outside IPython's
                 history, so `In`, `_ih` and `%history` never hold a hidden test.
    output       capped per cell and per notebook as messages arrive (autograder/output_caps.py);
                 a message over message_size_limit is refused by the socket itself, which then
                 is replaced: the grader's memory stays bounded whatever the kernel sends
    dead kernel  the cell fails with why ("the kernel died while running test_mean (exit status
                 139: killed by SIGSEGV ...)"), a fresh kernel starts, the lab's own setup cells
                 run again in it, and grading goes on: later tests run, and fail where the
                 learner's definitions are gone
    timeouts     past `timeout` the kernel is interrupted, as in nbgrader; one that does not stop
                 is replaced like a dead one
    answers      a test cell's answer_key("name") calls are replaced by the expected values the
                 grader computed outside the kernel (autograder/answers.py) in the code sent to
                 the kernel; the notebook keeps the cell as written
    learner      the kernel's JUPYTERHUB_USER is the student who handed the notebook in; a
                 notebook whose LEARNER names another learner is not run, each test scores zero
                 and the submission is flagged (autograder/learner.py)
Flags and per-cell reasons go to nb.metadata["gpulab_grading"], which worker.py reads back.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from queue import Empty
from time import monotonic

import zmq
from jupyter_core.utils import ensure_async, run_sync
from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import Dict, Integer

from autograder.answers import fill_in
from autograder.cells import Plan, Record
from autograder.integrity import (
    DATA_MARK,
    DATA_RULE,
    check_expression,
    install_expression,
    protect_expression,
    read_answer,
)
from autograder.kernel_manager import SandboxedKernels
from autograder.learner import kernel_environment, other_learner
from autograder.output_caps import OutputCaps

METADATA_KEY = "gpulab_grading"
SIGNAL_MEANING = {
    "SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "aborted",
    "SIGKILL": "out of memory, or past a limit", "SIGXCPU": "past its CPU-time limit",
    "SIGXFSZ": "past its file-size limit", "SIGTERM": "terminated",
}


class GradeExecute(OutputCaps, Execute):
    """nbgrader's Execute with integrity checks, output caps and fresh kernels when needed."""

    message_size_limit = Integer(64 << 20, help="bytes: a bigger message is refused").tag(
        config=True)
    output_queue_limit = Integer(32, help="output messages waiting to be read; past it a "
                                 "flooding kernel's output is dropped, not stored").tag(config=True)
    max_restarts = Integer(10, help="fresh kernels per notebook before the rest is not run").tag(
        config=True)
    answers = Dict(help="expected answers the test cells name: name -> value").tag(config=True)
    student: str | None = None  # who handed the notebook in (nbgrader's resources)

    def preprocess(self, nb, resources=None, km=None):
        NotebookClient.__init__(self, nb, km)  # as nbconvert's ExecutePreprocessor does
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self.plan, self.record = Plan.of(nb), Record()
        self.restarts, self.gave_up = 0, None
        self.reset_output_caps(notebook=True)
        # nbgrader's autograde says whose submission this is; run alone, nobody's.
        self.student = (resources or {}).get("nbgrader", {}).get("student")
        other = other_learner(nb, self.student) if self.student else None
        if other is not None:
            self._refuse_other_learner(*other)
        else:
            run_sync(self._run_notebook)()
        nb.metadata[METADATA_KEY] = self.record.as_metadata()
        return nb, self.resources

    async def _run_notebook(self) -> None:
        try:
            await self._start_kernel()
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type == "code" and cell.source.strip():
                    await self._run_cell(index, cell, self.plan.labels[index])
        finally:
            await self._discard_kernel()
        self.set_widgets_metadata()

    async def _run_cell(self, index: int, cell, label: str) -> None:
        test = self.plan.roles[index] == "test"
        if self.gave_up:
            cell.outputs = [_error("KernelError", self.gave_up)] if test else []
            return
        if test and (findings := await self._check(index, "before")):
            return self._void(cell, label, findings, "before this test")
        self.reset_output_caps()
        self._timed_out = False
        written = cell.source
        if test:  # the kernel gets the expected values themselves, not a way to compute them
            cell.source = fill_in(written, self.answers)
        try:
            await self.async_execute_cell(cell, index, execution_count=self.code_cells_executed
                                          + 1, store_history=not test)
        except DeadKernelError:
            why = f"the kernel died while running {label} ({await self._exit_reason()})"
            return await self._lose_kernel(index, cell, "kernel died", "DeadKernelError", why)
        except CellTimeoutError:  # the reply came, the cell's last messages did not
            if self._timed_out:
                why = f"{label} ran past the {self.timeout} s time limit and ignored the interrupt"
                return await self._lose_kernel(index, cell, "timeout", "CellTimeoutError", why)
            why = (f"{label}'s output stopped arriving (over {self.message_size_limit >> 20} MB in "
                   "one message?); the rest of it was dropped")
            cell.outputs.append(_error("OutputLimitError", why))
            self.record.note("output capped", label, why)
            await self._reconnect_output()
        finally:
            cell.source = written
            if self.capped:
                self.record.note("output capped", label, f"{label}: {self.add_cap_note(cell)}")
        if self._timed_out:
            self.record.note("timeout", label, f"{label} ran past the time limit of "
                             f"{self.timeout} s and was interrupted")
        if test and (findings := await self._check(index, "after")):
            self._void(cell, label, findings, "while this test ran")
        elif self.plan.protects.get(index):
            await self._silent({"guard": protect_expression(self.plan.protects[index])})

    # -- the kernel: start, check, lose, restart

    async def _start_kernel(self) -> None:
        self.km = self.create_kernel_manager()
        # The notebook's output travels over ZMQ; what C code writes to the kernel's own fd 1
        # would otherwise pile up in the grader's log.
        await self.async_start_new_kernel(
            stdout=subprocess.DEVNULL, env=kernel_environment(os.environ, self.student))
        self.kc = self.km.client()
        # pyzmq gives a context's options to the sockets it creates: a bigger message closes
        # the socket (replaced, see _reconnect_output) instead of filling the grader's memory.
        self.kc.context.setsockopt(zmq.MAXMSGSIZE, self.message_size_limit)
        # A kernel can print faster than a busy grader reads: bound the queue, so its memory is
        # at most this many messages (the default, 1000 x 1 MB lines, is a gigabyte).
        self.kc.context.setsockopt(zmq.RCVHWM, self.output_queue_limit)
        await ensure_async(self.kc.start_channels())
        await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
        self.kc.allow_stdin = False
        info = await self.async_wait_for_reply(await ensure_async(self.kc.kernel_info()))
        if info is not None:
            self.nb.metadata["language_info"] = info["content"]["language_info"]
        token = secrets.token_hex(8)
        config = {"token": token, "imports": self.plan.imports, "watch": self.plan.watch,
                  "data": self.plan.data,
                  "output_limit": 2 * self.cell_output_limit}  # the grader's cap comes first
        findings = read_answer(await self._silent({"guard": install_expression(config)}), token)
        if findings:
            raise RuntimeError("the integrity guard could not be set up in the grading kernel: "
                               + "; ".join(findings))

    async def _check_raise_for_error(self, cell, cell_index, exec_reply) -> None:
        """A cell fails when its reply says so, even if its error output never arrived (dropped
        by a flood of output, say): scoring reads the outputs, so put the error there."""
        content = (exec_reply or {}).get("content", {})
        if content.get("status") == "error" and not any(
                out.get("output_type") == "error" for out in cell.outputs):
            cell.outputs.append(new_output("error", ename=content.get("ename", "Error"),
                                           evalue=content.get("evalue", ""),
                                           traceback=content.get("traceback", [])))
        await super()._check_raise_for_error(cell, cell_index, exec_reply)

    async def _check(self, index: int, phase: str) -> list[str]:
        """The guard's findings before or after test cell `index`; a kernel that does not
        answer is replaced (and, before the test, the fresh one is checked)."""
        for attempt in range(2):
            token = secrets.token_hex(8)
            expression = check_expression(token, self.plan.reads.get(index, ()), phase)
            answer = await self._silent({"guard": expression})
            if answer is not None:
                return read_answer(answer, token)
            label = self.plan.labels[index]
            self.record.note("kernel died", label, f"the kernel stopped answering {phase} "
                             f"{label}; a fresh kernel was started")
            await self._restart(index)
            if phase == "after" or self.gave_up or attempt:
                break
        return [f"the kernel did not answer the integrity check {phase} this test"]

    async def _silent(self, user_expressions: dict, code: str = ""):
        """Run `code` silently and evaluate `user_expressions`: the reply's content, or None
        when the kernel died or did not answer in time."""
        msg_id = await ensure_async(self.kc.execute(
            code, silent=True, store_history=False, user_expressions=user_expressions,
            allow_stdin=False))
        # At least a minute: installing the guard imports the checkers (Numba) in the kernel.
        deadline = monotonic() + max(60, self.timeout or 0)
        while monotonic() < deadline:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(
                    timeout=max(0.01, min(1.0, deadline - monotonic()))))
            except Empty:
                if not await ensure_async(self.kc.is_alive()):
                    return None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return None

    async def _lose_kernel(self, index: int, cell, kind: str, ename: str, why: str) -> None:
        cell.outputs.append(_error(ename, why))
        self.record.note(kind, self.plan.labels[index], why + "; a fresh kernel was started")
        await self._restart(index)

    async def _restart(self, index: int) -> None:
        """A fresh kernel for the cells after `index`, with the lab's setup cells run again."""
        await self._discard_kernel()
        self.restarts += 1
        if self.restarts > self.max_restarts:
            self.gave_up = f"not run: the kernel was lost {self.max_restarts} times before this"
            self.record.note("not run", "the rest of the notebook", self.gave_up)
            return
        await self._start_kernel()
        for i in range(index):
            if self.plan.roles[i] == "setup":
                await self._silent({}, code=self.nb.cells[i].source)
                if self.plan.protects.get(i):
                    await self._silent({"guard": protect_expression(self.plan.protects[i])})

    async def _reconnect_output(self) -> None:
        """A new iopub socket: ZMQ closed the old one on an oversized message."""
        self.kc.iopub_channel.stop()
        self.kc._iopub_channel = None  # jupyter_client makes a new one on next use
        self.kc.iopub_channel.start()
        await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))

    async def _discard_kernel(self) -> None:
        km, kc, self.km, self.kc = self.km, self.kc, None, None
        if kc is not None:
            await ensure_async(kc.stop_channels())
        if km is None:
            return
        try:  # also on a dead kernel: its manager may have a sandbox to take down
            await ensure_async(km.shutdown_kernel(now=True))
        except Exception as error:  # already gone: nothing left to stop
            self.log.debug("shutting down a lost kernel: %s", error)

    async def _exit_reason(self) -> str:
        try:
            code = await ensure_async(self.km.provisioner.poll())
        except Exception:  # no process: no status to tell
            code = None
        return describe_exit(code)

    async def _async_handle_timeout(self, timeout, cell=None):
        self._timed_out = True  # nbclient interrupts the kernel; the cell then says why
        return await super()._async_handle_timeout(timeout, cell)

    def _refuse_other_learner(self, index: int, other: str) -> None:
        """A notebook written for another learner: no test runs, each scores zero."""
        why = (f'This notebook was written for another learner (LEARNER = "{other}"), but '
               f"{self.student} handed it in: it was not run, and each test scores zero. Set "
               "LEARNER to your own id (or leave it empty on JupyterHub), answer with your own "
               "numbers, and hand it in again.")
        for cell, role in zip(self.nb.cells, self.plan.roles, strict=True):
            if role == "test":
                cell.outputs, cell.execution_count = [_error("LearnerMismatch", why)], None
        self.record.note("learner mismatch", other)
        self.record.note(None, self.plan.labels[index], why)

    def _void(self, cell, label: str, findings: list[str], when: str) -> None:
        """A test that does not count: the machinery it relies on was changed."""
        changed = ", ".join(findings)
        rule = f" {DATA_RULE}" if any(DATA_MARK in finding for finding in findings) else ""
        cell.outputs = [_error("IntegrityError", f"{when}, the grader found the test machinery "
                               f"changed ({changed}): the test does not count.{rule}")]
        if when.startswith("before"):
            cell.execution_count = None
        for finding in findings:
            self.record.note("tampered", finding)
        self.record.note(None, label, f"IntegrityError {when}: {changed}")


class SandboxedGradeExecute(SandboxedKernels, GradeExecute):
    """GradeExecute whose kernels start in the sandbox (autograder/kernel_manager.py)."""


def describe_exit(code: int | None) -> str:
    """A kernel's exit status in words: "exit status 1", "killed by SIGSEGV (a segmentation
    fault)". A sandbox passes a killed kernel's signal on as 128 + the signal's number."""
    if code is None:
        return "it stopped answering"
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"exit status {code}"
    meaning = SIGNAL_MEANING.get(name)
    killed = f"killed by {name}" + (f" ({meaning})" if meaning else "")
    return killed if code < 0 else f"exit status {code}: {killed}"


def _error(ename: str, message: str):
    return new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])
