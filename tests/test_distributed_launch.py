"""run_on_ranks and torchrun_script: real processes, real gloo, and every way a launch can fail.

A launch's ranks are forked from a server that imported torch once (a fresh interpreter per
rank costs about 2.5 s of CPU), so a launch costs well under a second once the server runs.
Still, each test checks several things in one launch; the ones that also start a Jupyter
kernel or torchrun are marked slow. Every failing launch is also checked for leftovers: no
process started by the launcher may outlive the call.
"""

import functools
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from gpulab.distributed import (
    REQUEUE_EXIT_CODE,
    Launcher,
    LaunchTimeout,
    Notice,
    NoticeReport,
    Preempted,
    ProcessGroupStartError,
    RankError,
    run_on_ranks,
    torchrun_script,
)
from gpulab.distributed.runtime import by_value
from gpulab.distributed.runtime.worker import read_status

pytestmark = pytest.mark.dist

# A notebook cell, as a learner would write it: a model class, a dataclass, a helper, a global,
# a recursive function, a closure and a lambda, all defined in `__main__`.
NOTEBOOK_CELL = '''
from dataclasses import dataclass

import torch
import torch.distributed as dist

SCALE = 10.0

@dataclass(frozen=True)
class Settings:
    power: int = 2

class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):
        return (self.w * x).sum()

def scaled(x):
    return x * SCALE

def factorial(n):
    return 1 if n <= 1 else n * factorial(n - 1)

def make_power(k):
    return lambda v: v ** k

def notebook_fn(rank, world_size):
    t = torch.tensor([scaled(rank + 1.0)])
    dist.all_reduce(t)
    square = make_power(Settings().power)
    return t.item(), TinyNet()(torch.ones(3)).item(), factorial(4), square(rank)
'''


def notebook_module():
    """Execute NOTEBOOK_CELL in a fresh module named __main__, as a Jupyter kernel would."""
    module = types.ModuleType("__main__")
    exec(NOTEBOOK_CELL, module.__dict__)
    return module


def is_fork_server(process) -> bool:
    """The launcher's fork server (gpulab/distributed/runtime/forkserver.py): kept between
    launches on purpose. Its ranks are its children, and still count."""
    try:
        return "forkserver" in process.cmdline()  # bootstrap.py's role argument
    except psutil.Error:
        return False


def new_children(before: set) -> list:
    """Processes started by this test process since `before` that are still alive, except the
    fork server."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        if p.pid not in before and not is_fork_server(p):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
    return alive


@pytest.fixture
def no_leftovers():
    """Fails the test if the launcher left a process behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = new_children(before)
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()[:4]) for p in left]}"


def _report(rank, world_size, offset, *, scale=1):
    print(f"hello from rank {rank}")
    t = torch.tensor([float(rank + offset) * scale])
    dist.all_reduce(t)
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                      "MASTER_PORT")}
    return rank, world_size, env, dist.get_backend(), t.item()


def test_ranks_return_in_order_and_notebook_functions_travel(capsys, no_leftovers):
    # Two launches at once (one in a thread): each must get its own port, and the notebook's
    # function must run although it lives in a __main__ the ranks never imported.
    notebook = notebook_module()
    assert notebook.notebook_fn.__module__ == "__main__"
    from_thread = {}

    def launch_the_notebook_function():
        try:
            from_thread["values"] = run_on_ranks(notebook.notebook_fn, 2, backend="gloo")
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            from_thread["error"] = error

    thread = threading.Thread(target=launch_the_notebook_function)
    thread.start()
    values = run_on_ranks(_report, 2, 1, scale=10, backend="gloo")
    thread.join()

    assert [v[0] for v in values] == [0, 1] and {v[1] for v in values} == {2}
    assert {v[3] for v in values} == {"gloo"}
    assert [v[4] for v in values] == [30.0, 30.0], "(0+1)*10 + (1+1)*10 on both ranks"
    for rank, (_, _, env, _, _) in enumerate(values):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    out = capsys.readouterr().out
    assert "[rank 0] hello from rank 0" in out and "[rank 1] hello from rank 1" in out
    assert "error" not in from_thread, f"the notebook function failed: {from_thread.get('error')}"
    # (10 + 20), 2*3 from TinyNet, 4!, rank**2
    assert from_thread["values"] == [(30.0, 6.0, 24, 0), (30.0, 6.0, 24, 1)]


def _raise_on_rank_1(rank, world_size):
    if rank == 1:
        # Only once rank 0 is inside its barrier, as its status says: a rank's sys.argv is
        # bootstrap's (-c rank LAUNCH_DIR RANK), and its status file is in LAUNCH_DIR.
        rank_0 = Path(sys.argv[2]) / "rank0.status"
        while read_status(rank_0)[:1] != ("wait",):
            time.sleep(0.01)
        raise ValueError("rank 1 has a bad shard")
    dist.barrier()  # rank 0 waits here for a rank that will never come


def test_an_exception_comes_back_with_its_rank_and_traceback(no_leftovers):
    with pytest.raises(RankError) as caught:
        run_on_ranks(_raise_on_rank_1, 2, timeout_s=60, backend="gloo")
    error = caught.value
    assert error.rank == 1 and error.exc_type == "ValueError"
    assert isinstance(error.exception, ValueError)
    assert "raise ValueError(\"rank 1 has a bad shard\")" in error.traceback
    assert "_raise_on_rank_1" in error.traceback
    message = str(error)
    assert message.startswith("rank 1 raised ValueError: rank 1 has a bad shard")
    assert "rank 0 was stopped while waiting in barrier" in message


def _exit_abruptly(rank, world_size):
    # Both ranks past init_process_group first: a rank that vanished while the other was still
    # joining would fail that one's start-up instead (Gloo connectFullMesh), a start failure.
    dist.barrier()
    if rank == 1:
        print("about to vanish", flush=True)
        os._exit(7)
    time.sleep(60)


def test_a_rank_that_dies_is_reported_with_its_last_output(no_leftovers):
    with pytest.raises(RankError) as caught:
        run_on_ranks(_exit_abruptly, 2, timeout_s=60, backend="gloo")
    assert caught.value.rank == 1
    assert "exited with code 7" in str(caught.value)
    assert "about to vanish" in str(caught.value)


def _deadlock(rank, world_size):
    # A job that listens for SLURM's notice (--signal=USR1) must not lose its stack dump.
    signal.signal(signal.SIGUSR1, lambda *_: None)
    if rank == 0:
        dist.all_reduce(torch.ones(4))  # rank 1 never calls it
    return rank


def test_a_deadlock_is_cut_by_the_timeout_and_says_where(no_leftovers):
    with pytest.raises(LaunchTimeout) as caught:
        run_on_ranks(_deadlock, 2, timeout_s=2, backend="gloo")
    error = caught.value
    assert list(error.waiting) == [0], "only rank 0 was still running"
    assert "all_reduce" in error.waiting[0]
    assert "test_distributed_launch.py" in error.waiting[0], "the call site is named"
    message = str(error)
    assert "rank 0: waiting in all_reduce" in message and "Finished: rank 1" in message
    assert "_deadlock" in error.stacks[0], "rank 0's stack, captured before it was killed"


def _fail_start_once(marker, rank, world_size):
    """A start-up failure (before any user code) the first time only, on rank 1."""
    if rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionError("rendezvous refused (injected)")


def _fail_start_always(rank, world_size):
    if rank == 1:
        raise ConnectionError("rendezvous refused (injected)")


def test_a_start_up_failure_is_retried_once(tmp_path, capsys, caplog, no_leftovers):
    hook = functools.partial(_fail_start_once, str(tmp_path / "failed-once"))
    with caplog.at_level(logging.INFO, logger="gpulab.distributed.runtime.launch"):
        values = Launcher(2, before_init=hook).run(_report, 0)
    assert [v[4] for v in values] == [1.0, 1.0]
    logged = caplog.text
    assert "the process group failed to start" in logged and "retrying" in logged
    assert "ConnectionError: rendezvous refused (injected)" in logged
    # The notebook shows what a first-time success shows: no trace of the failed attempt.
    assert "rendezvous refused" not in capsys.readouterr().err


def test_a_persistent_start_up_failure_says_so(no_leftovers):
    with pytest.raises(ProcessGroupStartError) as caught:
        Launcher(2, before_init=_fail_start_always, start_retries=0).run(_report, 0)
    assert caught.value.rank == 1 and not caught.value.user_code_ran
    assert str(caught.value).startswith("the process group failed to start: rank 1 raised "
                                        "ConnectionError: rendezvous refused (injected)")


def test_an_unpicklable_global_is_named():
    lock = threading.Lock()
    namespace = {"lock": lock}
    exec("def uses_lock(rank, world_size):\n    with lock:\n        return rank", namespace)
    with pytest.raises(pickle.PicklingError, match="uses the global `lock`"):
        by_value.dumps(namespace["uses_lock"])


def test_notebook_functions_round_trip_by_value():
    notebook = notebook_module()
    fn = by_value.loads(by_value.dumps(notebook.notebook_fn))
    assert fn is not notebook.notebook_fn and fn.__globals__ is not notebook.__dict__
    factorial = fn.__globals__["factorial"]
    assert factorial(5) == 120, "a recursive function finds itself in the rebuilt globals"
    net = fn.__globals__["TinyNet"]()
    assert net(torch.ones(3)).item() == 6.0, "a class with super() is rebuilt with its methods"
    assert by_value.loads(by_value.dumps(_report)) is _report, "importable: by reference"


NOTEBOOK_CELLS = [
    "import gpulab\nfrom gpulab.distributed import run_on_ranks\nimport torch.distributed as dist",
    "import torch\n\ndef total(rank, world_size):\n    print('in the cell function')\n"
    "    t = torch.tensor([rank + 1.0])\n    dist.all_reduce(t)\n    return t.item()",
    "print(run_on_ranks(total, 2, backend='gloo'))",
]


@pytest.mark.slow
def test_a_function_defined_in_a_real_notebook_runs_on_ranks(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(out.get("text", "") for out in nb.cells[2].outputs)
    assert "[3.0, 3.0]" in text, text
    assert "[rank 0] in the cell function" in text and "[rank 1] in the cell function" in text


LAUNCH_AND_WAIT = """
import sys, time
import gpulab
from gpulab.distributed import run_on_ranks

def wait_forever(rank, world_size, folder):
    import os
    open(os.path.join(folder, f"rank{rank}.pid"), "w").write(str(os.getpid()))
    time.sleep(600)

run_on_ranks(wait_forever, 2, sys.argv[1], timeout_s=600, backend="gloo")
"""


@pytest.mark.slow
def test_ranks_die_with_the_kernel_that_launched_them(tmp_path):
    # The "kernel" is a Python process running run_on_ranks; it is SIGKILLed (no cleanup code
    # runs), and its ranks must not survive it.
    # TMPDIR: the launch folder the killed kernel cannot remove lands in tmp_path.
    kernel = subprocess.Popen([sys.executable, "-c", LAUNCH_AND_WAIT, str(tmp_path)],
                              env=dict(os.environ, TMPDIR=str(tmp_path)))
    pid_files = [tmp_path / f"rank{r}.pid" for r in range(2)]
    deadline = time.monotonic() + 90
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline and kernel.poll() is None, "the ranks never started"
        time.sleep(0.1)
    ranks = [int(f.read_text()) for f in pid_files]
    servers = [p.pid for p in psutil.Process(kernel.pid).children() if is_fork_server(p)]
    assert len(servers) == 1, "the ranks were forked from the kernel's fork server"
    kernel.send_signal(signal.SIGKILL)
    kernel.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in ranks + servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks), "a rank outlived its launcher"
    assert not _alive(servers[0]), "the fork server outlived its launcher"


def _fresh_state(rank, world_size):
    import random

    return os.getppid(), random.random(), torch.get_num_threads(), os.environ.get("GPULAB_X")


def _kill_my_parent(rank, world_size):
    if rank == 1:
        os.kill(os.getppid(), signal.SIGKILL)  # the fork server
    time.sleep(60)


def test_a_rank_that_kills_the_fork_server_is_reported_killed_and_the_next_launch_works(
        no_leftovers):
    with pytest.raises(RankError, match="killed by signal 9|SIGKILL"):
        run_on_ranks(_kill_my_parent, 2, backend="gloo", timeout_s=30)
    assert run_on_ranks(_report, 2, 0, backend="gloo")[0][4] == 1.0, "a new server"


def test_ranks_are_forked_from_one_server_and_start_as_fresh_interpreters(monkeypatch):
    """Two launches share the server; each rank draws its own random numbers and gets the
    launch's thread count and environment; a changed environment gets a new server (but not a
    new PYTEST_CURRENT_TEST, which nothing imported reads), and
    GPULAB_FRESH_RANKS=1 starts each rank as a fresh interpreter."""
    first = run_on_ranks(_fresh_state, 2, backend="gloo")
    second = run_on_ranks(_fresh_state, 2, backend="gloo")
    server = first[0][0]
    assert server != os.getpid() and is_fork_server(psutil.Process(server))
    assert {r[0] for r in first + second} == {server}, "one server for both launches"
    assert len({r[1] for r in first + second}) == 4, "each rank its own random numbers"
    assert {r[2] for r in first} == {max(1, (os.cpu_count() or 1) // 2)}, "OMP_NUM_THREADS"

    # pytest renames the running test before each phase: no reason to import torch again
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/next_test.py::test (call)")
    third = run_on_ranks(_fresh_state, 2, backend="gloo")
    assert {r[0] for r in third} == {server}, "kept across a change of PYTEST_CURRENT_TEST"

    monkeypatch.setenv("GPULAB_X", "set in a cell")
    changed = run_on_ranks(_fresh_state, 2, backend="gloo")
    assert {r[3] for r in changed} == {"set in a cell"}
    assert changed[0][0] != server and not _alive(server), "replaced, and the old one gone"

    monkeypatch.setenv("GPULAB_FRESH_RANKS", "1")
    fresh = run_on_ranks(_fresh_state, 2, backend="gloo")
    assert {r[0] for r in fresh} == {os.getpid()}, "children of the launcher itself"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


TORCHRUN_FAILS_ON_RANK_1 = """
import sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} sum {t.item():g} args {sys.argv[1:]}")
if rank == 1:
    raise RuntimeError("rank 1 fails after the all_reduce")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_reports_output_and_the_failing_rank(no_leftovers):
    # Two "nodes" of one rank each on this machine: two torchrun agents, one c10d rendezvous.
    result = torchrun_script(TORCHRUN_FAILS_ON_RANK_1, nproc_per_node=1, nnodes=2,
                             args=["--lr", "0.1"], echo=False)
    assert not result.ok and result.returncode != 0
    assert "[rank 0] rank 0 of 2 sum 2 args ['--lr', '0.1']" in result.stdout
    assert "[rank 1] rank 1 of 2 sum 2" in result.stdout
    assert result.failed_rank == 1
    assert "RuntimeError: rank 1 fails after the all_reduce" in result.error
    assert 'raise RuntimeError("rank 1 fails after the all_reduce")' in result.error


TORCHRUN_HANGS = """
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(600)
"""


def test_torchrun_time_limits_count_start_up_apart_from_the_run(tmp_path, monkeypatch):
    # The clock of torchrun_script and LocalCluster, on status lines written by hand: timeout_s
    # counts only while no rank is importing or inside init_process_group, however long that
    # took, and a rank that starts again gives start-up its own limit again.
    from gpulab.distributed.runtime import torchrun
    from gpulab.distributed.runtime.torchrun_entry import RAISED_STARTING
    from gpulab.distributed.runtime.worker import StatusBoard

    now = [0.0]
    monkeypatch.setattr(torchrun.time, "monotonic", lambda: now[0])
    boards = [StatusBoard(tmp_path / f"rank{r}.status", create=True) for r in range(2)]

    def starting():
        return torchrun.starting_ranks(tmp_path, 3)  # rank 2 has no status file yet

    clock = torchrun.RunClock(start_timeout_s=100, timeout_s=5)
    assert starting() == [0, 1, 2] and clock.passed(starting()) is None
    (tmp_path / "rank2.status").write_bytes(b"done|1.0|finished")
    boards[0].set("init", "init_process_group")
    boards[1].set("done", RAISED_STARTING)  # failed while joining: still start-up
    now[0] = 99.0
    assert starting() == [0, 1] and clock.passed(starting()) is None
    now[0] = 100.5
    assert clock.passed(starting()) == "start_timeout_s=100"
    clock = torchrun.RunClock(start_timeout_s=100, timeout_s=5)
    boards[0].set("run", "joined the process group")
    boards[1].set("wait", "all_reduce")
    assert starting() == [] and clock.passed(starting()) is None  # the run begins at 100.5
    now[0] = 105.0
    assert clock.passed(starting()) is None
    boards[1].set("init", "init_process_group")  # joins a group again: start-up again
    now[0] = 150.0
    assert clock.passed(starting()) is None
    boards[1].set("run")
    assert clock.passed(starting()) is None  # the run begins again at 150
    now[0] = 155.5
    assert clock.passed(starting()) == "timeout_s=5"
    for board in boards:
        board.close()


@pytest.mark.slow
def test_torchrun_hang_is_cut_by_the_timeout(no_leftovers):
    with pytest.raises(LaunchTimeout) as caught:
        torchrun_script(textwrap.dedent(TORCHRUN_HANGS), nproc_per_node=2, timeout_s=6,
                        echo=False, name="hang.py")
    error = caught.value
    assert "all_reduce (called at " in error.waiting[0] and "hang.py:6" in error.waiting[0]
    assert "rank 1: running" in str(error)
    assert "hang.py" in error.stacks[1], "rank 1's stack shows where it sleeps"


def test_code_sent_by_value_keeps_its_file_name():
    # cloudpickle 3.1.3 renames it "<dynamic-code>"; the labs' messages quote the learner's cell
    cell = types.ModuleType("__main__")
    exec(compile("def f(x):\n    return x + 1\n", "/tmp/ipykernel_0/cell.py", "exec"),
         cell.__dict__)
    g = by_value.loads(by_value.dumps(cell.f))
    assert g(1) == 2 and g.__code__.co_filename == "/tmp/ipykernel_0/cell.py"


def _steps_until_noticed(rank, world_size, target: int, ignore: bool):
    """Counts the SIGTERMs it gets and prints the count every step, with "ready" from step 3 on.
    The target stops at the step boundary after a notice with the requeue code, or, `ignore`,
    never; the other ranks return after 6 steps."""
    got = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    for step in range(400 if rank == target else 6):  # 20 s at most: a notice must come
        print(f"step {step} signals {len(got)}" + (" ready" if step >= 3 else " almost rea"),
              flush=True)
        if got and not ignore:
            sys.exit(REQUEUE_EXIT_CODE)
        time.sleep(0.05)
    return len(got)


def _steps_lines(text: str, rank: int) -> list[tuple[str, int]]:
    """(ready or not, signals so far) per step line of `rank`."""
    return [("ready" if line.endswith(" ready") else "not", int(line.split()[5]))
            for line in text.splitlines() if line.startswith(f"[rank {rank}] step ")]


def test_a_notice_reaches_one_rank_which_saves_and_asks_for_a_requeue(capsys, no_leftovers):
    notice = Notice(target=1, on_output="ready", grace_s=20.0)
    with pytest.raises(Preempted) as caught:
        run_on_ranks(_steps_until_noticed, 2, 1, False, timeout_s=60, backend="gloo", notice=notice)
    report = caught.value.report
    assert report.where == "rank 1" and report.ranks == (1,) and report.signal_name == "SIGTERM"
    assert report.exited_in_grace and not report.killed and report.took_s < 20.0
    assert report.exit_codes == {1: REQUEUE_EXIT_CODE} and caught.value.requeue_requested
    assert caught.value.values == {0: 0}, "rank 0 got no signal and returned"
    message = str(caught.value)
    assert message.startswith("rank 1 was given notice: SIGTERM")
    assert "exited by itself within the grace period" in message and "requeue requested" in message
    assert "rank 0 returned" in message
    lines = _steps_lines(capsys.readouterr().out, 1)
    assert all(count == 0 for ready, count in lines if ready == "not"), \
        "a line that only resembles the trigger sent nothing"
    assert lines[-1][1] == 1


def test_a_rank_that_ignores_its_notice_is_killed_after_the_grace_period(capsys, no_leftovers):
    notice = Notice(target=0, on_output="ready", grace_s=1.5)
    with pytest.raises(Preempted) as caught:
        run_on_ranks(_steps_until_noticed, 1, 0, True, timeout_s=60, backend="gloo", notice=notice)
    report = caught.value.report
    assert report.killed and not report.requeue_requested
    assert report.exit_codes == {0: -signal.SIGKILL} and 1.5 <= report.took_s < 15.0
    assert "did not exit within the grace period and was killed (SIGKILL)" in str(caught.value)
    counts = [count for _, count in _steps_lines(capsys.readouterr().out, 0)]
    assert max(counts) == 1, "the trigger came on many lines, the signal once"


def _returns_before_the_trigger(rank, world_size, folder: str):
    """Rank 0 returns at once; rank 1 prints the trigger once rank 0 is about to return."""
    if rank == 0:
        Path(folder, "returning").touch()
        return rank
    while not Path(folder, "returning").exists():
        time.sleep(0.05)
    time.sleep(2.0)  # rank 0's result is sent by now
    print("ready", flush=True)
    time.sleep(0.5)
    return rank


def test_a_notice_for_a_rank_that_already_returned_changes_nothing(tmp_path, no_leftovers):
    notice = Notice(target=0, on_output="ready", grace_s=1.0)
    assert run_on_ranks(_returns_before_the_trigger, 2, str(tmp_path), timeout_s=60,
                        backend="gloo", notice=notice) == [0, 1]


def test_a_notice_report_tells_a_chosen_exit_from_a_signal_nothing_handled():
    def told(exit_codes: dict) -> str:
        return str(NoticeReport("node 1", "SIGTERM", 10.0, 5.0, tuple(exit_codes), exit_codes,
                                exited_in_grace=True, took_s=0.1))

    assert "It exited by itself within the grace period, 0.1 s after the notice, with exit " \
        "code 75 (requeue requested)." in told({1: REQUEUE_EXIT_CODE})
    # Without a handler, SIGTERM's default action ends a rank in time, but not "by itself".
    assert "It ended within the grace period, 0.1 s after the notice, killed by SIGTERM: no " \
        "handler caught it." in told({1: -signal.SIGTERM})
    assert "did not leave through Python" in told({0: None, 1: None}), \
        "under torchrun a rank that a signal ended leaves no code of its own"
    mixed = told({0: REQUEUE_EXIT_CODE, 1: -signal.SIGSEGV})
    assert "ended within" in mixed and "with exit code 75; killed by SIGSEGV." in mixed
    assert "no handler" not in mixed and "requeue requested" not in mixed
    assert told({}).endswith("None of its ranks was running yet: nothing received the signal.")


def test_a_notice_is_checked():
    with pytest.raises(ValueError, match="notice.target must be a rank"):
        run_on_ranks(_report, 2, 0, notice=Notice(target=2, on_output="x"))
    with pytest.raises(ValueError, match="on_output"):
        Notice(target=0, on_output="")
