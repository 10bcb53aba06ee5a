"""The grading kernel's sandbox, tried from inside: hostile submissions of the fixture lab.

Four learners replace one answer cell each with an attack; the cell prints what it could do,
and the test reads that back from the autograded notebook:

    spy      reads the solutions, the grading root's source notebook and gradebook, lists other
             submissions, writes outside its scratch folder, connects to a port this test
             listens on, and says which uid it runs as; then answers both parts right
    hog      allocates 8 GiB (the profile allows 1 GiB) before defining `mean`
    bomb     starts processes until it cannot (the profile allows 64 tasks)
    sleeper  sleeps forever where `mean` should be (the profile's cell timeout is 10 s)

Each attack must fail, cost only its own part, and leave no process behind. The same spy,
graded with --no-sandbox, does leak: that shows the probe can see a leak when there is one.
"""

import os
import re
import shutil
import socket
import sys
import threading
from dataclasses import asdict, replace
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course, repository_root
from autograder.grade import grade
from autograder.jail import JAIL_PREFIX, UID_BASE, processes_of
from autograder.kernel_manager import SandboxedKernelManager
from autograder.profiles import GIB, get_profile
from autograder.sandbox import Confinement, SandboxSettings, bwrap_args, confinement
from autograder.sandbox_kernel import kernel_environment
from autograder.worker import GradeTask, autograde_config

FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"
PROBE = f"sandbox-probe-{os.getpid()}"  # in the environment of the bomb's children
MEAN = "def mean(xs):\n    return sum(xs) / len(xs)\n"
RUNNING_MAX = (
    "def running_max(xs):\n    out, best = [], xs[0]\n    for x in xs:\n"
    "        best = max(best, x)\n        out.append(best)\n    return out\n"
)

slow = pytest.mark.slow
full_sandbox = pytest.mark.skipif(
    bool(confinement().weaknesses(SandboxSettings())),
    reason="needs the full sandbox: bubblewrap and a root grader (see `make test`)",
)


def spy_cell(reads: list[Path], listings: list[Path], writes: list[Path], port: int) -> str:
    """An answer cell that tries each attack and prints `LEAK what` or `blocked what`."""
    return f"""import os, socket
def attempt(what, action):
    try:
        action()
        print("LEAK", what)
    except Exception as exc:
        print("blocked", what, type(exc).__name__)
for path in {[str(p) for p in reads]!r}:
    attempt("read " + path, lambda: open(path, "rb").read(1))
for path in {[str(p) for p in listings]!r}:
    attempt("list " + path, lambda: os.listdir(path))
for path in {[str(p) for p in writes]!r}:
    attempt("write " + path, lambda: open(path, "w").write("graded: 100"))
attempt("connect 127.0.0.1:{port}",
        lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3).close())
open("scratch.txt", "w").write("mine")
print("cwd", sorted(os.listdir(".")))
print(f"uid={{os.getuid()}}")
""" + MEAN


HOG = "import os\nprint(f'uid={os.getuid()}')\nhog = bytearray(8 << 30)\n" + MEAN
BOMB = f"""import os, subprocess
print(f"uid={{os.getuid()}}")
children = []
try:
    while len(children) < 1000:  # bounded, should the limit not hold
        env = {{"PATH": "/usr/bin:/bin", "{PROBE}": "1"}}
        children.append(subprocess.Popen(["sleep", "600"], env=env))
finally:
    print(f"started {{len(children)}} processes")
""" + RUNNING_MAX
SLEEPER = "import os, time\nprint(f'uid={os.getuid()}')\ntime.sleep(10**6)\n" + MEAN


class Listener:
    """A TCP port on 127.0.0.1 that counts who connects."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def submit(subs: Path, student: str, cell_id: str, source: str) -> None:
    nb = nbformat.read(FIXTURE / LAB / NOTEBOOK, as_version=4)
    next(c for c in nb.cells if c.get("id") == cell_id).source = source
    (subs / student).mkdir(parents=True)
    nbformat.write(nb, subs / student / NOTEBOOK)


def printed(result, cell_id: str) -> str:
    """What a cell of the autograded notebook wrote, errors included."""
    nb = nbformat.read(Path(result.autograded) / NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    return "\n".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}"
                     for o in cell.outputs)


def uid_of(text: str) -> int:
    return int(re.search(r"uid=(\d+)", text).group(1))


def probe_children() -> list[int]:
    """Pids of processes started by the bomb (marked in their environment)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if PROBE.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    listener = Listener()
    subs = root.parent / f"{root.name}-submissions"
    grading = root / ".grading"
    reads = [
        root / "solutions" / LAB / NOTEBOOK,
        repository_root() / "solutions" / "lab1_cuda_kernels" / "lab1_cuda_kernels.ipynb",
        grading / "source" / LAB / NOTEBOOK,
        grading / "gradebook.db",
    ]
    listings = [root / "solutions", grading, grading / "tmp", subs]
    writes = [root / "solutions" / "pwned.txt", grading / "pwned.txt", subs / "pwned.txt"]
    spy = spy_cell(reads, listings, writes, listener.port)
    submit(subs, "spy", "mean", spy)
    submit(subs, "hog", "mean", HOG)
    submit(subs, "bomb", "running_max", BOMB)
    submit(subs, "sleeper", "mean", SLEEPER)
    return root, subs, listener, reads, listings, writes


@pytest.fixture(scope="module")
def sandboxed(course):
    root, subs, listener, *_ = course
    profile = replace(get_profile("cpu"), cell_timeout_s=10, cpu_time_s=120,
                      memory_bytes=GIB, max_processes=64)
    results = grade(Course.at(root), LAB, subs, profile, progress=False, jobs=2)
    return {r.student_id: r for r in results}, listener.connections


@slow
@full_sandbox
def test_the_spy_reads_writes_and_connects_nothing_outside(course, sandboxed):
    _, _, _, reads, listings, writes = course
    results, connections = sandboxed
    spy = results["spy"]
    assert (spy.score, spy.max_score) == (5.0, 5.0), "the rest of the notebook is graded"
    text = printed(spy, "mean")
    assert all(path.exists() for path in reads + listings), "each target is there to find"
    assert "LEAK" not in text, text
    attempts = [f"read {p}" for p in reads] + [f"list {p}" for p in listings]
    for what in attempts + [f"write {p}" for p in writes]:
        assert f"blocked {what} " in text, f"no attempt to {what}:\n{text}"
    assert not any(path.exists() for path in writes)
    assert connections == 0, "the kernel reached a port on the grader's loopback"
    assert f"cwd ['{NOTEBOOK}', 'scratch.txt']" in text, "scratch: its own notebook only"
    assert uid_of(text) not in (0, os.getuid()), "the kernel runs as a user of its own"
    assert spy.warnings == ()


@slow
@full_sandbox
def test_a_memory_hog_fails_within_the_limit(sandboxed):
    hog = sandboxed[0]["hog"]
    assert "MemoryError" in printed(hog, "mean")
    assert (hog.score, hog.max_score) == (3.0, 5.0), "part 2 is still graded"


@slow
@full_sandbox
def test_a_fork_bomb_is_contained(sandboxed):
    bomb = sandboxed[0]["bomb"]
    text = printed(bomb, "running_max")
    started = int(re.search(r"started (\d+) processes", text).group(1))
    assert 0 < started < 64, text
    assert "BlockingIOError" in text, "the limit stops it, not the loop's bound"
    assert (bomb.score, bomb.max_score) == (2.0, 5.0), "part 1 is still graded"


@slow
@full_sandbox
def test_a_cell_that_sleeps_forever_is_cut_by_the_cell_timeout(sandboxed):
    sleeper = sandboxed[0]["sleeper"]
    assert re.search(r"CellTimeoutError|KeyboardInterrupt", printed(sleeper, "mean"))
    assert (sleeper.score, sleeper.max_score) == (3.0, 5.0), "part 2 is still graded"


@slow
@full_sandbox
def test_no_process_or_folder_of_a_sandbox_survives_its_kernel(sandboxed):
    results, _ = sandboxed
    assert probe_children() == [], "the bomb's children outlived the kernel"
    for student, cell in (("spy", "mean"), ("hog", "mean"), ("bomb", "running_max"),
                          ("sleeper", "mean")):
        uid = uid_of(printed(results[student], cell))
        assert processes_of(uid) == [], f"{student}'s processes outlived its kernel"
        worker_pid = uid - UID_BASE
        assert not list(Path("/tmp").glob(f"{JAIL_PREFIX}{worker_pid}-*")), "jail left behind"


def run_cell(source: str, manager_class, folder: Path, settings=None) -> str:
    """Run one code cell in a fresh kernel started by `manager_class`, from `folder` (which
    gets a copy of the fixture's notebook); what the cell printed."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    config = Config()
    config.SandboxedKernelManager.sandbox = asdict(settings or SandboxSettings())
    shutil.copyfile(FIXTURE / LAB / NOTEBOOK, folder / NOTEBOOK)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(nb, timeout=60, kernel_name="python3", kernel_manager_class=manager_class,
                   config=config, allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return "".join(o.get("text", "") or f"{o.get('ename')}: {o.get('evalue')}"
                   for o in nb.cells[0].outputs)


@slow
def test_the_spy_does_leak_from_a_kernel_without_the_sandbox(course, sandboxed, tmp_path):
    """The control: the same spy in a plain kernel reads, lists and connects (so the probe sees
    a leak when there is one)."""
    from jupyter_client.manager import AsyncKernelManager

    _, _, listener, reads, listings, _ = course
    before = listener.connections
    spy = spy_cell(reads, listings, [tmp_path / "control.txt"], listener.port)
    text = run_cell(spy, AsyncKernelManager, tmp_path)
    for what in [f"read {p}" for p in reads] + [f"list {p}" for p in listings]:
        assert f"LEAK {what}" in text, text
    assert listener.connections == before + 1


def test_no_sandbox_asks_for_it_and_warns(tmp_path, monkeypatch, capsys):
    import autograder.grade

    asked = []
    monkeypatch.setattr(autograder.grade, "grade", lambda *a, **k: asked.append(a[3]) or [])
    assert main(["grade", LAB, str(tmp_path), "--root", str(tmp_path), "--no-sandbox"]) == 0
    assert [profile.sandboxed for profile in asked] == [False]
    assert "WARNING, weaker sandbox: sandbox off (--no-sandbox)" in capsys.readouterr().err


def test_cell_timeout_replaces_the_profiles_limit_and_nothing_else(tmp_path, monkeypatch):
    import autograder.grade

    asked = []
    monkeypatch.setattr(autograder.grade, "grade", lambda *a, **k: asked.append(a[3]) or [])
    assert main(["grade", LAB, str(tmp_path), "--root", str(tmp_path)]) == 0
    assert main(["grade", LAB, str(tmp_path), "--root", str(tmp_path), "--cell-timeout",
                 "600"]) == 0
    default, longer = asked
    assert (default.cell_timeout_s, longer.cell_timeout_s) == (180, 600)
    assert replace(longer, cell_timeout_s=180) == default
    with pytest.raises(SystemExit):  # argparse: a limit must be a positive whole number
        main(["grade", LAB, str(tmp_path), "--cell-timeout", "0"])


@slow
def test_without_bubblewrap_the_kernel_still_gets_its_limits_and_a_clean_environment(
    monkeypatch, tmp_path
):
    """The fallback: no namespaces (and here no uid of its own: this Python lives under /root),
    but the launcher's limits, scratch folder and environment still apply."""
    import autograder.kernel_manager

    weak = Confinement(None, root=os.geteuid() == 0, own_uid=False,
                       why_no_bwrap="bwrap is not installed", why_no_uid="for this test")
    monkeypatch.setattr(autograder.kernel_manager, "confinement", lambda: weak)
    monkeypatch.setenv("GRADER_SECRET", "s3cr3t")
    probe = ("import os, resource\n"
             "print(resource.getrlimit(resource.RLIMIT_DATA)[0], os.getcwd(),\n"
             "      sorted(os.listdir('.')), os.environ.get('GRADER_SECRET'))")
    limits = replace(SandboxSettings(), memory_bytes=GIB)
    text = run_cell(probe, SandboxedKernelManager, tmp_path, limits)
    data_limit, cwd, listing, secret = text.split(" ", 3)
    assert int(data_limit) == GIB
    assert Path(cwd).name == "home" and Path(cwd).parent.name.startswith(JAIL_PREFIX)
    assert listing.strip("[]',") == NOTEBOOK and secret.strip() == "None"
    assert not Path(cwd).exists(), "the jail is removed after the kernel"


def test_a_weaker_sandbox_is_written_into_the_grade(monkeypatch):
    import autograder.sandbox
    from autograder.worker import sandbox_warnings

    weak = Confinement(None, root=True, own_uid=True, why_no_bwrap="bwrap is not installed")
    monkeypatch.setattr(autograder.sandbox, "confinement", lambda: weak)
    task = GradeTask(LAB, "ada", "lab", "sub", "/nonexistent", cell_timeout_s=60)
    (warning,) = sandbox_warnings(task)
    assert warning.startswith("no bubblewrap (bwrap is not installed)")
    assert "solutions/" in warning, "it says what the kernel can read"


# --- without a kernel ---------------------------------------------------------------------------

def test_weaknesses_name_what_is_missing():
    settings = SandboxSettings()
    assert confinement().weaknesses(replace(settings, enabled=False))[0].startswith(
        "sandbox off (--no-sandbox)")
    full = Confinement("/usr/bin/bwrap", root=True, own_uid=True)
    assert full.weaknesses(settings) == ()
    bare = Confinement(None, root=False, own_uid=False, why_no_bwrap="bwrap is not installed",
                       why_no_uid="the grader is not root")
    first, second = bare.weaknesses(settings)
    assert "apt-get install bubblewrap" in first and "network" in first
    assert "the grader is not root" in second and "process limit" in second


def test_autograde_starts_its_kernels_through_the_sandbox(tmp_path):
    """Whatever execute preprocessor autograde uses, its kernel manager is the sandboxed one,
    configured with the task's limits."""
    from nbclient import NotebookClient
    from nbgrader.converters import Autograde

    limits = asdict(replace(SandboxSettings(), max_processes=77))
    task = GradeTask(LAB, "ada", "lab", "sub", str(tmp_path), cell_timeout_s=60, sandbox=limits)
    config = autograde_config(tmp_path, task)
    executes = [p for p in Autograde(config=config).autograde_preprocessors
                if issubclass(p, NotebookClient)]
    assert executes, "autograde executes the notebook"
    for execute in executes:
        manager_class = execute(config=config).kernel_manager_class
        assert issubclass(manager_class, SandboxedKernelManager), execute
        assert manager_class(config=config).settings.max_processes == 77


def test_the_sandbox_binds_no_course_folder(tmp_path):
    from autograder.jail import close_jail, open_jail

    jail = open_jail(None, None)
    try:
        args = bwrap_args(jail, SandboxSettings(gpu=True), root=True)
    finally:
        close_jail(jail)
    sources = {args[i + 1] for i, a in enumerate(args) if a.endswith("bind") or a.endswith("-try")}
    repo = repository_root()
    assert str(repo / ".venv") in sources or sys.prefix in sources, "the interpreter is there"
    assert str(repo / "gpulab") in sources, "the course package, at its real path"
    for source in sources:
        assert Path(source).resolve() not in (repo, repo / "solutions", repo / "tests"), source
        assert "solutions" not in Path(source).parts and ".grading" not in Path(source).parts


def test_the_kernel_inherits_no_secret_from_the_grader():
    grader = {"GPULAB_RUNNER": "cpu", "MPLBACKEND": "Agg", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
              "GITHUB_TOKEN": "t0k3n", "PYTHONPATH": "/work/main", "JPY_PARENT_PID": "1234",
              "AUTOGRADER_SCRATCH": "/grading/tmp/x", "HOME": "/root"}
    env = kernel_environment(grader, "/home/learner", "/tmp")
    assert env["GPULAB_RUNNER"] == "cpu" and env["MPLBACKEND"] == "Agg"
    assert env["HOME"] == "/home/learner" and env["USER"] == "learner"
    for name in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "PYTHONPATH", "AUTOGRADER_SCRATCH"):
        assert name not in env, name
    assert env["JPY_PARENT_PID"] == "1", "pid 1234 is not this process's parent: don't watch it"
    # The runner profile's one-thread setting reaches the kernel through the sandbox.
    threads = kernel_environment(get_profile("cpu").kernel_env(grader), "/home/learner", "/tmp")
    assert threads["OMP_NUM_THREADS"] == threads["MKL_NUM_THREADS"] == "1"
