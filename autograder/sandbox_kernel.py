"""Become the grading kernel: limits first, then an unprivileged uid, then ipykernel (exec).

    python -I -m autograder.sandbox_kernel --home=DIR [--uid=N] [limits] -- KERNEL ARGV...

The last trusted code before a learner's. It runs inside bubblewrap (autograder/sandbox.py),
or in its place where bubblewrap is missing, and does in order:

    1. resource limits from the runner profile; hard limits too, so the learner's code cannot
       raise them back. RLIMIT_NPROC counts the tasks (processes *and* threads) of the real uid
    2. an environment of its own: the grader's variables (tokens, paths) do not reach the kernel
    3. the sandbox's uid and gid, no supplementary groups, no capabilities, no_new_privs (no
       setuid program can give them back)
    4. exec the kernel command: nothing of this process survives into the kernel

It imports nothing from the course, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import sys

PR_SET_NO_NEW_PRIVS = 38
# What the kernel inherits from the grader's environment: the runner profile's variables and
# what numerical libraries and CUDA read. Everything else is dropped.
KEEP_PREFIXES = ("GPULAB_", "NUMBA_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_", "LC_")
# JUPYTERHUB_USER is the student who handed the notebook in, set by the grader
# (autograder/learner.py): the notebook draws that learner's numbers, as on their hub.
KEEP_NAMES = {"MPLBACKEND", "LANG", "TZ", "JPY_SESSION_NAME", "PYDEVD_DISABLE_FILE_VALIDATION",
              "JUPYTERHUB_USER"}
PATH = "/usr/local/bin:/usr/bin:/bin"
CPU_GRACE_S = 5  # between SIGXCPU (soft limit) and SIGKILL (hard limit)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder.sandbox_kernel")
    parser.add_argument("--home", required=True, help="the kernel's cwd and $HOME")
    parser.add_argument("--tmp", default="/tmp", help="the kernel's $TMPDIR")
    parser.add_argument("--uid", type=int, help="run as this uid and gid (needs root)")
    parser.add_argument("--groups", default="", help="supplementary gids, comma-separated")
    parser.add_argument("--cpu-time-s", type=int, default=0)
    parser.add_argument("--memory-bytes", type=int, default=0)
    parser.add_argument("--address-space-bytes", type=int, default=0)
    parser.add_argument("--max-processes", type=int, default=0)
    parser.add_argument("--max-file-bytes", type=int, default=0)
    parser.add_argument("command", nargs="+", help="the kernel's command line, after --")
    return parser


def set_limits(args: argparse.Namespace) -> None:
    """Each limit as given (0 = leave as it is); core dumps always off."""
    limits = {
        resource.RLIMIT_CPU: (args.cpu_time_s, args.cpu_time_s + CPU_GRACE_S),
        resource.RLIMIT_DATA: (args.memory_bytes,) * 2,
        resource.RLIMIT_AS: (args.address_space_bytes,) * 2,
        resource.RLIMIT_NPROC: (args.max_processes,) * 2,
        resource.RLIMIT_FSIZE: (args.max_file_bytes,) * 2,
    }
    for which, (soft, hard) in limits.items():
        if soft > 0:
            resource.setrlimit(which, (soft, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def kernel_environment(environ: dict[str, str], home: str, tmp: str) -> dict[str, str]:
    """The kernel's variables: a fresh set, plus the few the grader passes on on purpose."""
    env = {k: v for k, v in environ.items() if k.startswith(KEEP_PREFIXES) or k in KEEP_NAMES}
    # ipykernel exits when its parent changes. Without bubblewrap our parent is the grader's
    # worker: watch it. Inside, it is bubblewrap's init, pid 1, which ipykernel takes for "no
    # parent to watch" (the kernel dies with the namespace anyway).
    parent = environ.get("JPY_PARENT_PID")
    env["JPY_PARENT_PID"] = parent if parent == str(os.getppid()) else "1"
    venv_bin = os.path.dirname(sys.executable)
    env.update(
        HOME=home,
        USER="learner",
        LOGNAME="learner",
        TMPDIR=tmp,
        IPYTHONDIR=f"{tmp}/ipython",  # IPython's profile folder: not in the learner's scratch
        PATH=f"{venv_bin}:{PATH}",
        LANG=env.get("LANG", "C.UTF-8"),
        PYTHONNOUSERSITE="1",
    )
    return env


def drop_privileges(uid: int, groups: list[int]) -> None:
    """Become `uid` for good: real, effective and saved ids, only `groups` (the GPU's, when its
    devices are closed to others), no new privileges."""
    os.setgroups(groups)
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to a non-zero uid: every capability is dropped
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.chdir(args.home)
    set_limits(args)
    env = kernel_environment(dict(os.environ), args.home, args.tmp)
    if args.uid is not None:
        drop_privileges(args.uid, [int(g) for g in args.groups.split(",") if g])
    os.umask(0o077)
    os.execve(args.command[0], args.command, env)
    return 1  # not reached: execve replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
