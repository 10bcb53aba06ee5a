"""nbgrader's kernels started in the sandbox (autograder/sandbox.py): the Jupyter side of it.

nbgrader executes a notebook through nbclient, which starts a kernel with a jupyter_client
KernelManager. `SandboxedKernelManager` is that manager with four changes:

    start      a jail per kernel (scratch home with the notebooks' copies, a socket folder,
               the sandbox's uid), and ZMQ over `ipc` sockets in that folder: the kernel has no
               network to reach a TCP port with
    command    ipykernel's command line wrapped in bubblewrap and autograder/sandbox_kernel.py
    interrupt  by message, not by signal: the process the manager holds is bubblewrap, which a
               SIGINT would kill; ipykernel interrupts itself on an `interrupt_request`
    shutdown   whatever still runs as the sandbox's uid is killed and the jail deleted

`SandboxedKernels` is the mixin an execute preprocessor takes to use it: nbgrader's Execute
picks its kernel manager class in __init__, where configuration cannot reach, so the mixin
picks ours there (tests/test_autograder_sandbox.py checks that autograde's does). Its settings
come from the traitlets Config that `autograde_config` builds (`SandboxedKernelManager.sandbox`:
a SandboxSettings as plain data). A worker runs one kernel at a time: they share its uid.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from nbgrader.preprocessors import Execute
from traitlets import Dict

from autograder.jail import Jail, close_jail, open_jail, sandbox_uid, tasks_of
from autograder.sandbox import SandboxSettings, confinement, kernel_command


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels start confined (see the module docstring)."""

    sandbox = Dict(
        default_value=asdict(SandboxSettings()),
        help="autograder.sandbox.SandboxSettings as a dict: limits, gpu, enabled",
    ).tag(config=True)

    _jail: Jail | None = None

    @property
    def settings(self) -> SandboxSettings:
        return SandboxSettings(**self.sandbox)

    async def start_kernel(self, **kw):
        settings = self.settings
        if not settings.enabled or self._jail is not None:  # off, or a restart: same jail
            return await super().start_kernel(**kw)
        found = confinement()
        uid = sandbox_uid() if found.own_uid else None
        notebooks = Path(kw["cwd"]) if kw.get("cwd") else None
        self._jail = open_jail(notebooks, uid)
        self.transport = "ipc"
        self.ip = str(self._jail.run / "kernel")  # sockets kernel-1, kernel-2, ... in run/
        self.connection_file = str(self._jail.run / "connection.json")
        kw["cwd"] = str(self._jail.home)
        try:
            return await super().start_kernel(**kw)
        except BaseException:
            self._close_jail()
            raise

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self._jail is None:
            return cmd
        self._jail.give(Path(self.connection_file))  # written by now, 0600, for the kernel
        settings = self.settings
        if settings.thread_stack_bytes and self.ipykernel:
            # Before the notebook's first cell, leaving no name in the learner's namespace.
            size = settings.thread_stack_bytes
            cmd.append(f"--IPKernelApp.exec_lines=exec('import threading; "
                       f"threading.stack_size({size})', {{}})")
        # Not root: the kernel's uid is the grader's, whose own tasks count against its limit.
        allowance = 0 if self._jail.uid is not None else tasks_of(os.getuid())
        return kernel_command(cmd, self._jail, settings, confinement(), allowance)

    @property
    def kernel_spec(self):
        spec = super().kernel_spec
        if spec is not None and self._jail is not None:
            spec.interrupt_mode = "message"
        return spec

    async def shutdown_kernel(self, now: bool = False, restart: bool = False):
        try:
            return await super().shutdown_kernel(now=now, restart=restart)
        finally:
            if not restart:
                self._close_jail()

    def _close_jail(self) -> None:
        if self._jail is not None:
            close_jail(self._jail)
            self._jail = None


class SandboxedKernels:
    """Mixin for an execute preprocessor: its kernels start through SandboxedKernelManager."""

    def __init__(self, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(**kwargs)


class SandboxedExecute(SandboxedKernels, Execute):
    """nbgrader's Execute, with sandboxed kernels."""
