"""The grading kernel's sandbox: what a learner's code can see, touch and use while it is graded.

The worker that starts a kernel holds the lab's source (answers, hidden tests) and a gradebook,
so it is the kernel itself that is confined, with what Linux gives:

    namespaces   bubblewrap: pid (the kernel's processes die with it), network (a loopback of
                 its own, no way out), ipc, uts, mount, cgroup; a new session (no terminal)
    filesystem   read-only: /usr, /lib*, a few /etc files, the interpreter, the virtual
                 environment and the course's packages at their real paths (gpulab is an
                 editable install); writable: a scratch home holding a copy of the submission's
                 notebooks (the kernel's cwd), a private /tmp and /dev/shm (size-capped), and the
                 folder of the kernel's sockets. Not the repository (solutions/), not the grading
                 root, not other submissions.
    identity     a uid of its own, with no passwd entry on the host (autograder/jail.py)
    limits       the runner profile's RLIMIT_CPU, _DATA, _AS, _NPROC, _FSIZE and RLIMIT_CORE=0,
                 set by autograder/sandbox_kernel.py before ipykernel starts
    gpu          the gpu runner's kernels also get /dev/nvidia*, /sys (read-only) and the
                 driver's libraries: all that CUDA and NVML open

The kernel talks to its client over ZMQ `ipc` sockets in a folder bound into the sandbox, so it
needs no network; autograder/kernel_manager.py wires all this into nbgrader. Where something is
missing (no bubblewrap, no user namespaces, a grader that is not root) `Confinement.weaknesses`
says what is weaker, on stderr and in each grade. `python -m autograder.sandbox` tells how a
kernel would be confined on this machine (exit status 1 when less than fully).

Limits are per process, as rlimits are: a kernel's children each get the same allowance, the
process limit bounds how many there are, and /tmp and /dev/shm use memory of their own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from autograder.course import repository_root
from autograder.jail import HOME, Jail, sandbox_uid

GIB = 1 << 30
# Read-only system folders; the usrmerge ones (/bin -> usr/bin) are re-created as links.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the loader, Python and the C library read from /etc; nothing that names people or hosts.
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "mime.types",
    "alternatives", "fonts", "ssl/certs", "timezone",
)
# /dev/nvidia0.., nvidiactl, nvidia-uvm(-tools), nvidia-modeset, nvidia-caps/: CUDA's devices.
GPU_DEVICES = "/dev/nvidia*"
PROBE_TIMEOUT_S = 10


class SandboxError(RuntimeError):
    """The sandbox cannot be set up as it must be; the message says what to change."""


@dataclass(frozen=True)
class SandboxSettings:
    """The sandbox one runner profile asks for (plain data: it travels in the worker's task)."""

    enabled: bool = True  # False: `--no-sandbox`, for code the instructor trusts
    gpu: bool = False  # let CUDA in: the GPU's device nodes, /sys, the driver's libraries
    cpu_time_s: int = 3600  # RLIMIT_CPU: CPU seconds of each kernel process, all threads
    memory_bytes: int = 4 * GIB  # RLIMIT_DATA: heap, anonymous maps and thread stacks
    address_space_bytes: int = 16 * GIB  # RLIMIT_AS, 0 = none (CUDA reserves terabytes of it)
    max_processes: int = 2048  # RLIMIT_NPROC: processes and threads of the sandbox's uid
    max_file_bytes: int = GIB  # RLIMIT_FSIZE: the largest file the kernel may write
    tmp_bytes: int = GIB  # size of each of the private, memory-backed /tmp and /dev/shm
    # Stack of each new thread (0: the C library's 8 MiB). The CUDA simulator runs a thread per
    # CUDA thread, 1024 for a full block: at 8 MiB each that would be 8 GiB of RLIMIT_DATA.
    thread_stack_bytes: int = 1 << 20

    def launcher_args(self) -> list[str]:
        """The limits as autograder/sandbox_kernel.py's options."""
        return [
            f"--cpu-time-s={self.cpu_time_s}",
            f"--memory-bytes={self.memory_bytes}",
            f"--address-space-bytes={self.address_space_bytes}",
            f"--max-file-bytes={self.max_file_bytes}",
        ]


@dataclass(frozen=True)
class Confinement:
    """What this machine lets the grader do to confine a kernel (see `confinement`)."""

    bwrap: str | None  # a bubblewrap that works here, or None
    root: bool  # the grader runs as root: no user namespace needed, uids to hand out
    own_uid: bool  # the kernel gets a uid of its own
    why_no_bwrap: str = ""
    why_no_uid: str = ""

    def weaknesses(self, settings: SandboxSettings) -> tuple[str, ...]:
        """What is weaker than the full sandbox, one sentence each; empty when nothing is."""
        if not settings.enabled:
            return (
                "sandbox off (--no-sandbox): learners' code runs as the grader, sees its files "
                "and the network, with no limits but the cell timeout; grade trusted code only",
            )
        weaker = []
        if not self.bwrap:
            weaker.append(
                f"no bubblewrap ({self.why_no_bwrap}): the kernel shares the grader's "
                "filesystem, network and process table; it can read every world-readable "
                "file, the repository's solutions/ included, and reach the network. Install "
                "it: apt-get install bubblewrap"
            )
        if not self.own_uid:
            weaker.append(
                f"no uid of its own ({self.why_no_uid}): the kernel runs as the grader's user, "
                "its process limit is shared with that user's processes"
                + ("" if self.bwrap else ", and it may read and write all that user may")
            )
        return tuple(weaker)


@functools.cache
def confinement() -> Confinement:
    """Probe once per process: does bubblewrap work here (it needs namespaces), and can the
    kernel run as a uid of its own?"""
    root = os.geteuid() == 0
    bwrap, why_no_bwrap = _probe_bwrap(root)
    if not root:
        return Confinement(bwrap, root, False, why_no_bwrap, "the grader is not root")
    if bwrap:  # the sandbox shows the interpreter through folders that anyone may enter
        return Confinement(bwrap, root, True)
    # Without bubblewrap the kernel sees the host's folders: its uid must be able to start
    # Python from where it is (a pyenv under /root, mode 0700, is out of reach).
    uid = sandbox_uid()
    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], user=uid, group=uid,
                       extra_groups=[], cwd="/", capture_output=True, check=True,
                       timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        why = f"an unprivileged user cannot run {sys.executable}"
        return Confinement(None, root, False, why_no_bwrap, why)
    return Confinement(None, root, True, why_no_bwrap)


def _probe_bwrap(root: bool) -> tuple[str | None, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bwrap is not installed"
    probe = [bwrap, *_namespace_args(root), "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap failed to start: {exc}"
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no message"
        return None, f"bwrap cannot create namespaces here: {reason}"
    return bwrap, ""


def _namespace_args(root: bool) -> list[str]:
    # Root needs no user namespace (the launcher switches uid itself); anyone else gets one,
    # which bubblewrap creates on its own when it is not setuid.
    namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    namespaces += ["--unshare-cgroup-try"] + ([] if root else ["--unshare-user"])
    return [*namespaces, "--die-with-parent", "--new-session"]


def package_dirs() -> list[Path]:
    """Folders of the course's packages: gpulab for the kernel, autograder for its launcher."""
    return [Path(importlib.util.find_spec(name).origin).parent for name in ("gpulab", "autograder")]


def _python_dirs() -> list[Path]:
    """The interpreter, the virtual environment and the course's packages, each at its real path
    (the venv's bin/python is a link into the base interpreter; editable installs point out)."""
    dirs = set()
    for path in (Path(sys.base_prefix), Path(sys.prefix), *package_dirs()):
        dirs.update({path.absolute(), path.resolve()})
    outside_usr = [d for d in dirs if not d.is_relative_to("/usr")]
    # One bind per tree: a package inside the venv comes with the venv.
    return sorted(d for d in outside_usr if not any(d != o and d.is_relative_to(o)
                                                     for o in outside_usr))


def _gpu_mounts() -> list[tuple[str, str, str]]:
    """What CUDA needs beyond /usr: its device nodes, /sys (PCI topology, NUMA, NVML), the
    persistence daemon's socket, and the driver's libraries and the toolkit (NVVM, libdevice
    for Numba) where they live outside /usr: on the loader's path or at CUDA_HOME."""
    import glob

    mounts = [("--dev-bind", node, node) for node in sorted(glob.glob(GPU_DEVICES))]
    mounts.append(("--ro-bind", "/sys", "/sys"))
    mounts.append(("--ro-bind-try", "/run/nvidia-persistenced", "/run/nvidia-persistenced"))
    folders = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    folders += [os.environ.get(name, "") for name in ("CUDA_HOME", "CUDA_PATH")]
    for folder in dict.fromkeys(f for f in folders if f and Path(f).is_dir()):
        if not Path(folder).resolve().is_relative_to("/usr"):
            mounts.append(("--ro-bind", folder, folder))
    return mounts


def _gpu_groups() -> list[int]:
    """Groups that own GPU device nodes closed to others (0660 root:video, say): the kernel's
    uid joins them, or CUDA finds no device."""
    import glob

    closed = [os.stat(node) for node in glob.glob(GPU_DEVICES)]
    return sorted({st.st_gid for st in closed if not st.st_mode & 0o006})


def bwrap_args(jail: Jail, settings: SandboxSettings, root: bool) -> list[str]:
    """bubblewrap's options for one kernel: namespaces, then the filesystem it sees."""
    args = _namespace_args(root)
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for tmp in ("/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", str(settings.tmp_bytes), "--tmpfs", tmp]
    mounts = [("--ro-bind-try", f"/etc/{name}", f"/etc/{name}") for name in ETC_FILES]
    mounts += [("--ro-bind", str(jail.root / "etc" / name), f"/etc/{name}")
               for name in ("passwd", "group", "hosts")]
    mounts += [("--ro-bind", str(path), str(path)) for path in _python_dirs()]
    mounts += [("--bind", str(jail.run), str(jail.run)), ("--bind", str(jail.home), HOME)]
    if settings.gpu:
        mounts += _gpu_mounts()
    made = {Path(p) for p in ("/", "/dev", "/proc", "/tmp", "/dev/shm", *SYSTEM_DIRS)}
    trees = []  # folders bound from the host: what lies under them exists already
    for kind, source, dest in mounts:
        # bubblewrap makes missing parents 0700, which the kernel's uid could not pass through.
        for parent in reversed(Path(dest).parents):
            if parent not in made and not any(parent.is_relative_to(t) for t in trees):
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
        args += [kind, source, dest]
        if Path(source).is_dir():
            trees.append(Path(dest))
            _refuse_answers(Path(source))
    return [*args, "--hostname", "sandbox", "--chdir", HOME]


def _refuse_answers(tree: Path) -> None:
    # A virtual environment made at the repository's root, a library path pointing into it:
    # binding such a folder would show the kernel the lab sources. Better no grade than that.
    answers = repository_root() / "solutions"
    if answers.is_dir() and answers.resolve().is_relative_to(tree.resolve()):
        raise SandboxError(
            f"the grading kernel would see {answers}: {tree} is bound into its sandbox as part "
            "of the Python environment. Give the virtual environment a folder of its own (such "
            "as the repository's .venv/), not the repository's root."
        )


def kernel_command(
    kernel_cmd: list[str],
    jail: Jail,
    settings: SandboxSettings,
    found: Confinement,
    process_allowance: int = 0,
) -> list[str]:
    """`kernel_cmd` (ipykernel and its connection file) as started in the sandbox.

    `process_allowance`: processes the kernel's uid already has outside it (the grader's own
    when it is not root), added to the profile's RLIMIT_NPROC.
    """
    home, tmp = (HOME, "/tmp") if found.bwrap else (jail.home, jail.tmp)
    launcher = [
        sys.executable, "-I", "-m", "autograder.sandbox_kernel", *settings.launcher_args(),
        f"--max-processes={settings.max_processes + process_allowance}",
        f"--home={home}", f"--tmp={tmp}",
    ]
    if jail.uid is not None:
        launcher.append(f"--uid={jail.uid}")
        if settings.gpu and _gpu_groups():
            launcher.append(f"--groups={','.join(map(str, _gpu_groups()))}")
    launcher = [*launcher, "--", *kernel_cmd]
    if not found.bwrap:
        return launcher
    return [found.bwrap, *bwrap_args(jail, settings, found.root), "--", *launcher]


def main() -> int:
    """`python -m autograder.sandbox`: how confined a grading kernel is on this machine."""
    found = confinement()
    weaker = found.weaknesses(SandboxSettings())
    for line in weaker:
        print(f"WEAKER: {line}")
    if not weaker:
        print(f"full sandbox: {found.bwrap}, a uid of its own per kernel, rlimits")
    return 1 if weaker else 0


if __name__ == "__main__":
    sys.exit(main())
