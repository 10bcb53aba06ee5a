"""One grading kernel's jail on the host: its private folders, its uid, and its end.

    <tmp>/gpulab-kernel-<worker pid>-XXXX/     0711: the uid may pass through, not list
        home/   the scratch folder: copies of the submission's notebooks; the kernel's cwd and
                $HOME, seen inside the sandbox as /home/learner; owned by the uid
        tmp/    its $TMPDIR, where bubblewrap is missing (in the sandbox: a private /tmp)
        run/    the kernel's ipc sockets and connection file, at the same path inside
        etc/    passwd, group, hosts of two lines each, bound over the sandbox's /etc

The uid is the worker's own (UID_BASE + its pid), with no passwd entry on the host: no other
process shares it, so RLIMIT_NPROC counts only this kernel's processes, and `close_jail` can
end every one of them with one kill(-1) sent as that uid, fork bombs and daemons included.
The jail lives in the system's temporary folder because a unix socket's path must fit in 107
bytes; jails left by a killed worker are removed when the next one opens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# A uid per worker process, far above distributions' user and subordinate-id ranges (which
# end below 2**31 only by convention; 1.9e9 + a pid is still below 2**31 - 1).
UID_BASE = 1_900_000_000
HOME = "/home/learner"  # the scratch folder, as the kernel sees it: its cwd and $HOME
JAIL_PREFIX = "gpulab-kernel-"  # + the worker's pid: the folder of one kernel's jail


def sandbox_uid() -> int:
    """This worker's sandbox uid: one per live process, so parallel workers never share one."""
    return UID_BASE + os.getpid()


@dataclass(frozen=True)
class Jail:
    """One kernel's private folders on the host, and the uid it runs as."""

    root: Path  # private to this kernel; removed after it
    uid: int | None  # None: the grader's own (not root, or no sandbox)

    @property
    def home(self) -> Path:
        return self.root / "home"  # scratch: the notebooks' copy, cwd, $HOME; HOME inside

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"  # $TMPDIR where bubblewrap is missing (else a private /tmp)

    @property
    def run(self) -> Path:
        return self.root / "run"  # ipc sockets and the connection file, at the same path inside

    def give(self, path: Path) -> None:
        """Hand `path` to the sandbox's uid (the kernel must read and write it)."""
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)


def open_jail(notebooks_from: Path | None, uid: int | None) -> Jail:
    """Private folders for one kernel, holding copies of the notebooks in `notebooks_from`."""
    _remove_stale_jails(Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=f"{JAIL_PREFIX}{os.getpid()}-"))
    root.chmod(0o711)  # the uid may pass through to run/ and home/, not list the folder
    jail = Jail(root, uid)
    for folder in (jail.home, jail.tmp, jail.run, root / "etc"):
        folder.mkdir(mode=0o700)
    for path in sorted(notebooks_from.glob("*.ipynb")) if notebooks_from else ():
        shutil.copyfile(path, jail.home / path.name)
        jail.give(jail.home / path.name)
    for folder in (jail.home, jail.tmp, jail.run):
        jail.give(folder)
    # A passwd of two lines: the kernel's uid gets a name (getpass, torch, IPython ask).
    who = uid if uid is not None else os.getuid()
    (root / "etc").chmod(0o755)
    (root / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\nlearner:x:{who}:{who}::{HOME}:/bin/sh\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\nlearner:x:{who}:\n")
    # ::ffff:127.0.0.1 too: gloo's ranks look up the name of their peers' IPv4-mapped addresses.
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n"
                                        "::ffff:127.0.0.1 localhost\n")
    return jail


def _remove_stale_jails(folder: Path) -> None:
    # A worker killed before it could close its jail: its pid is gone, its uid's processes too
    # (they died with bubblewrap's namespace, or are killed here).
    for path in folder.glob(f"{JAIL_PREFIX}*-*"):
        pid = path.name.removeprefix(JAIL_PREFIX).split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():  # its worker is gone
            close_jail(Jail(path, UID_BASE + int(pid) if os.geteuid() == 0 else None))


def close_jail(jail: Jail) -> None:
    """Kill whatever still runs as the jail's uid, then delete its folders."""
    if jail.uid is not None:
        kill_processes_of(jail.uid)
    shutil.rmtree(jail.root, ignore_errors=True)


def processes_of(uid: int) -> list[int]:
    """Pids of the live (not zombie) processes whose real uid is `uid`."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue  # gone while we looked
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(status.parent.name))
    return pids


def tasks_of(uid: int) -> int:
    """Processes and threads of `uid`: what RLIMIT_NPROC counts."""
    count = 0
    for pid in processes_of(uid):
        try:
            count += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return count


def kill_processes_of(uid: int, attempts: int = 5) -> None:
    """SIGKILL every process of `uid`, fork bombs included: kill(-1) sent *as* that uid hits
    all of them in one system call, so none can fork a replacement in between."""
    # /usr/bin/kill (procps or util-linux) runs as any uid; this Python may not (under /root).
    kill = shutil.which("kill", path="/usr/bin:/bin")
    command = [kill, "-9", "--", "-1"] if kill else [
        sys.executable, "-I", "-S", "-c", "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass"]
    for _ in range(attempts):
        if not processes_of(uid):
            return
        subprocess.run(command, user=uid, group=uid, extra_groups=[], cwd="/",
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
