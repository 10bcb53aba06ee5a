"""`grade --jobs N`, and nothing lost: parallel grading gives the serial grades, a grader killed
or interrupted mid-run finishes its batch when run again, and no worker or kernel outlives it.

The fast tests take the pieces apart (fingerprints, the grading root's lock, the lifeline that
ties a worker to its grader, the sweep of leftover processes); the slow ones grade six
fixture-lab submissions of varied correctness (about 3 s of CPU each).
"""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import nbformat
import psutil
import pytest
from nbgrader.api import Gradebook

from autograder.course import COURSE_ID, Course, CourseError, gradebook_url
from autograder.export import rows
from autograder.grade import fingerprint, grade
from autograder.gradebook import records, writer_lock
from autograder.pool import LIFELINE, SCRATCH_TAG, WorkerPool, kill_leftovers, kill_tree
from autograder.profiles import get_profile
from autograder.submissions import Submission

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"


# --- helpers -----------------------------------------------------------------------------------

def edit_cell(nb, cell_id: str, old: str, new: str):
    cell = next(c for c in nb.cells if c.get("id") == cell_id)
    assert old in cell.source, f"{old!r} not in cell {cell_id}: the fixture lab changed"
    cell.source = cell.source.replace(old, new)
    return nb


def hand_in(subs: Path, student: str, nb) -> None:
    (subs / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, subs / student / NOTEBOOK)


def digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cell_scores(grading: Path) -> dict:
    """student -> {grade_id: auto_score}, straight from the gradebook."""
    with Gradebook(gradebook_url(grading), COURSE_ID) as gradebook:
        return {
            s.student.id: {g.name: g.auto_score for nb in s.notebooks for g in nb.grades}
            for s in gradebook.find_assignment(LAB).submissions
        }


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def grading_processes(course_dir: Path) -> dict[int, psutil.Process]:
    """The workers of runs on `course_dir` (tagged with a scratch folder in it), and every
    process they started: nbgrader's helpers, the kernel."""
    tmp, found = str(course_dir / "tmp"), {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(SCRATCH_TAG, "").startswith(tmp):
                found[process.pid] = process
                found.update({c.pid: c for c in process.children(recursive=True)})
        except psutil.Error:
            continue
    return found


def is_kernel(process: psutil.Process) -> bool:
    try:
        return any("ipykernel" in part for part in process.cmdline())
    except psutil.Error:
        return False


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"after {timeout} s: {what}")


def ctrl_c_as_in_a_terminal() -> None:
    """In the grader's process, before it starts: SIGINT's default action, as an instructor's
    terminal gives it. A shell runs what it starts in the background (`make test &`, a CI
    runner's job) with SIGINT ignored, and that is inherited: the grader would never see the
    Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Grader:
    """`python -m autograder grade` in a subprocess, as an instructor runs it, watched from here."""

    runs = 0
    started: list["Grader"] = []  # every grader of this module: stopped after each test

    def __init__(self, root: Path, subs: Path, course_dir: Path, *options: str):
        Grader.runs += 1
        self.course_dir = course_dir
        self.log = course_dir.parent / f"{course_dir.name}-{Grader.runs}.log"
        command = [sys.executable, "-m", "autograder", "grade", LAB, str(subs),
                   "--root", str(root), "--course-dir", str(course_dir), *options]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log,
                                            preexec_fn=ctrl_c_as_in_a_terminal)
        Grader.started.append(self)
        self.seen: dict[int, psutil.Process] = {}

    def watch(self) -> dict[int, psutil.Process]:
        self.seen.update(grading_processes(self.course_dir))
        return self.seen

    def recorded(self) -> int:
        return len(list((self.course_dir / "records" / LAB).glob("*.json")))

    # The waits below end on an event; their limits only stop a grader that never gets there,
    # and are generous: with two `make test` runs side by side on 2 cores, grading the fixture
    # lab's first submission took over 90 s.
    def wait_until(self, condition, what: str, timeout: float = 600):
        def check():
            self.watch()
            assert self.process.poll() is None, f"the grader ended early:\n{self.output()}"
            return condition()
        return wait_for(check, timeout, what)

    def output(self) -> str:
        return self.log.read_text()

    def finish(self, timeout: float = 600) -> int:
        return self.process.wait(timeout=timeout)


@pytest.fixture(autouse=True)
def no_grader_outlives_its_test():
    """A test that fails while a grader runs leaves it (and its kernels) to this: they would
    run on, and count as another test's leftovers."""
    yield
    while Grader.started:
        grader = Grader.started.pop()
        if grader.process.poll() is None:
            kill_tree(grader.process.pid)
            grader.process.wait()


def assert_all_gone(processes: dict[int, psutil.Process], within: float) -> None:
    try:
        wait_for(lambda: not any(alive(p) for p in processes.values()), within, "")
    except AssertionError:
        left = [f"{p.pid} {_command(p)}" for p in processes.values() if alive(p)]
        if left:
            raise AssertionError(f"after {within} s still running: {', '.join(left)}") from None


def _command(process: psutil.Process) -> str:
    # Named only once the wait is over: a process may die (a zombie, then gone) at any moment.
    try:
        return " ".join(process.cmdline())[:80]
    except psutil.Error:
        return "(gone while being named)"


# --- fast: the pieces --------------------------------------------------------------------------

def test_a_fingerprint_follows_the_graded_bytes_not_the_paths(tmp_path):
    source, first, second = tmp_path / "source", tmp_path / "a", tmp_path / "b"
    for folder in (source, first, second):
        folder.mkdir()
    shutil.copyfile(FIXTURE / LAB / NOTEBOOK, source / NOTEBOOK)
    for folder in (first, second):
        shutil.copyfile(FIXTURE / LAB / NOTEBOOK, folder / NOTEBOOK)
    profile = get_profile("cpu")
    at_a = fingerprint(source, Submission("ada", (first / NOTEBOOK,)), profile)
    assert at_a == fingerprint(source, Submission("ada", (second / NOTEBOOK,)), profile)
    (second / NOTEBOOK).write_bytes((second / NOTEBOOK).read_bytes() + b" ")
    assert at_a != fingerprint(source, Submission("ada", (second / NOTEBOOK,)), profile)
    assert at_a != fingerprint(source, Submission("ada", (first / NOTEBOOK,)),
                               replace(profile, cell_timeout_s=5)), "the profile counts"
    (source / NOTEBOOK).write_bytes((source / NOTEBOOK).read_bytes() + b" ")
    assert at_a != fingerprint(source, Submission("ada", (first / NOTEBOOK,)), profile)


def test_one_grader_at_a_time_per_grading_root_and_a_killed_one_releases_it(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from autograder.gradebook import writer_lock\n"
         "with writer_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n"
         "    time.sleep(60)", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CourseError, match=f"being graded right now \\(pid {holder.pid}\\)"):
            with writer_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(tmp_path):  # the operating system dropped the killed holder's lock
        pass


def test_a_worker_dies_with_its_grader():
    # The "grader" starts a long `sleep` through the lifeline, in a session of its own (as a
    # worker is started), then is SIGKILLed: only the death signal can end the sleep early.
    grader = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "from autograder.pool import LIFELINE\n"
         "child = subprocess.Popen([sys.executable, '-c', LIFELINE, str(os.getpid()), "
         "'/bin/sleep', '60'], start_new_session=True)\n"
         "print(child.pid, flush=True)\ntime.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    worker = psutil.Process(int(grader.stdout.readline()))
    wait_for(lambda: worker.cmdline()[:1] == ["/bin/sleep"], 10, "the lifeline never exec'd")
    grader.kill()
    grader.wait()
    assert_all_gone({worker.pid: worker}, within=10)
    assert "PR_SET_PDEATHSIG" in LIFELINE


def test_leftover_processes_of_a_grading_root_are_found_by_tag_or_folder(tmp_path):
    tmp = tmp_path / "grading" / "tmp"
    (tmp / "run-1" / "bob").mkdir(parents=True)
    tagged = subprocess.Popen(["sleep", "60"], env={**os.environ, SCRATCH_TAG: str(tmp / "x")})
    inside = subprocess.Popen(["sleep", "60"], cwd=tmp / "run-1" / "bob")
    other = subprocess.Popen(["sleep", "60"], cwd=tmp_path)  # not this root's
    try:
        watched = [psutil.Process(tagged.pid), psutil.Process(inside.pid)]
        assert kill_leftovers(tmp) == 2
        assert not any(alive(process) for process in watched)
        assert other.poll() is None
    finally:
        for process in (tagged, inside, other):
            process.kill()
            process.wait()


def test_a_pool_needs_at_least_one_job():
    with pytest.raises(ValueError, match="at least 1"):
        WorkerPool(get_profile("cpu"), jobs=0)


# --- slow: grading batches ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course with the fixture lab, and six learners' submissions (read-only)."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    solution = nbformat.read(root / "solutions" / LAB / NOTEBOOK, as_version=4)
    subs = root / "subs"
    hand_in(subs, "ada", solution)
    hand_in(subs, "bob", edit_cell(nbformat.from_dict(solution), "mean", "return sum(xs) / len(xs)",
                                   "raise NotImplementedError()"))
    hand_in(subs, "cy", edit_cell(nbformat.from_dict(solution), "running_max",
                                  "out, best = [], xs[0]", "out, best = [], 0"))
    hand_in(subs, "dee", edit_cell(nbformat.from_dict(solution), "mean", "return sum(xs) / len(xs)",
                                   "return sum(xs) / (len(xs) + 1)"))
    both_wrong = edit_cell(nbformat.from_dict(solution), "mean", "return sum(xs) / len(xs)",
                           "return xs[0]")
    hand_in(subs, "eve", edit_cell(both_wrong, "running_max", "out, best = [], xs[0]",
                                   "return xs\n    out, best = [], xs[0]"))
    slow = edit_cell(nbformat.from_dict(solution), "mean", "def mean", "import time\n"
                     "time.sleep(2)  # a slow learner: keeps its kernel busy\n\n\ndef mean")
    hand_in(subs, "fay", slow)
    for path in subs.rglob("*.ipynb"):
        path.chmod(0o444)  # a grader that writes to a submission fails loudly
    return root, subs


@pytest.fixture(scope="module")
def serial(course):
    root, subs = course
    grading = root / "serial"
    results = grade(Course.at(root, grading), LAB, subs, jobs=1, progress=False)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return cell_scores(grading), rows(Course.at(root, grading))


@pytest.fixture(scope="module")
def parallel(course):
    root, subs = course
    grading = root / "parallel"
    results = grade(Course.at(root, grading), LAB, subs, jobs=2, progress=False)
    return grading, results


@pytest.mark.slow
def test_the_serial_batch_has_varied_grades(serial):
    scores, table = serial
    totals = {row.student_id: row.score for row in table}
    assert len(set(totals.values())) >= 4, totals  # a batch that could tell grades apart
    assert totals["ada"] == totals["fay"] == 5


@pytest.mark.slow
def test_two_jobs_give_the_serial_grades_in_a_consistent_gradebook(course, serial, parallel):
    root, _ = course
    grading, results = parallel
    assert [r.student_id for r in results] == ["ada", "bob", "cy", "dee", "eve", "fay"]
    assert cell_scores(grading) == serial[0]
    assert rows(Course.at(root, grading)) == serial[1]
    found = records(grading)
    assert sorted(found) == [(LAB, r.student_id) for r in results]
    for result in results:
        assert Path(result.autograded) == grading / "autograded" / result.student_id / LAB
        assert (Path(result.autograded) / NOTEBOOK).is_file()
        assert found[LAB, result.student_id].result["scores"] == [
            vars(c) for c in result.scores], "the record holds what the gradebook holds"
    assert not any((grading / "tmp").iterdir()), "worker folders are removed"


@pytest.mark.slow
def test_a_rerun_grades_only_what_changed(course, parallel, tmp_path):
    root, subs = course
    grading = tmp_path / "grading"
    shutil.copytree(parallel[0], grading)  # a grading root can move: records are relative
    changed = tmp_path / "subs"
    shutil.copytree(subs, changed)
    (changed / "dee" / NOTEBOOK).chmod(0o644)
    shutil.copyfile(subs / "ada" / NOTEBOOK, changed / "dee" / NOTEBOOK)  # dee hands in again
    results = grade(Course.at(root, grading), LAB, changed, jobs=2, progress=False)
    assert [r.student_id for r in results] == ["ada", "bob", "cy", "dee", "eve", "fay"]
    assert {r.student_id: r.score for r in results}["dee"] == 5
    again = grade(Course.at(root, grading), LAB, changed, students=["bob"], regrade=True,
                  progress=False)
    assert [r.student_id for r in again] == ["bob"]
    old, fresh = records(parallel[0]), records(grading)
    for student in ("bob", "dee"):  # handed in again; asked to --regrade
        assert fresh[LAB, student].result["seconds"] != old[LAB, student].result["seconds"]
    for student in ("ada", "cy", "eve", "fay"):  # unchanged: kept, not graded again
        assert fresh[LAB, student] == old[LAB, student], student


def gated(subs: Path, into: Path, student: str) -> Path:
    """A copy of `subs` in which `student`'s kernel waits, before its first answer, until a
    file `go` appears in its working folder (let_go): the batch cannot finish before then."""
    shutil.copytree(subs, into)
    path = into / student / NOTEBOOK
    path.chmod(0o644)
    held = edit_cell(nbformat.read(path, as_version=4), "mean", "def mean",
                     "import os, time\nwhile not os.path.exists('go'):  # until the test lets go\n"
                     "    time.sleep(0.05)\n\n\ndef mean")
    nbformat.write(held, path)
    path.chmod(0o444)
    return into


def let_go(grader: Grader) -> bool:
    """Put `go` in the working folder of each kernel of `grader` (through /proc: a sandboxed
    kernel's folder is private); True once the grader has ended."""
    for process in grader.watch().values():
        if is_kernel(process):
            try:
                (Path(f"/proc/{process.pid}/cwd") / "go").touch()
            except OSError:  # gone meanwhile, or its wrapper's folder is not writable
                pass
    return grader.process.poll() is not None


@pytest.mark.slow
def test_an_interrupted_then_killed_grader_finishes_with_the_same_grades(course, serial,
                                                                         tmp_path):
    root, _ = course
    subs = gated(course[1], tmp_path / "subs", "fay")  # fay's grade waits for the test's word
    before = digest(subs)
    grading = root / "interrupted"
    # Ctrl-C once a grade is recorded: the grader stops its workers, cleans up, exits 130.
    first = Grader(root, subs, grading, "--jobs", "2")
    first.wait_until(lambda: first.recorded() >= 1, "nothing recorded")
    first.process.send_signal(signal.SIGINT)
    assert first.finish() == 130, first.output()
    assert "run the same command again" in first.output()
    assert_all_gone(first.seen, within=5)
    assert not any((grading / "tmp").iterdir()), "an interrupted run removes its folders"
    # SIGKILL while a kernel runs: the grader cannot clean up, its workers die with it.
    done = first.recorded()
    second = Grader(root, subs, grading, "--jobs", "2")
    second.wait_until(lambda: second.recorded() > done, "nothing more recorded")
    second.wait_until(lambda: any(is_kernel(p) for p in second.watch().values()), "no kernel")
    second.process.kill()
    second.finish()
    assert_all_gone(second.seen, within=15)
    assert any((grading / "tmp").iterdir()), "a killed run leaves its folders behind"
    kept = second.recorded()
    assert kept < 6, "fay's grade cannot be recorded before the test lets her kernel go"
    # The same command again (with four jobs): it cleans up, skips what is recorded, finishes
    # once fay's kernel may go on.
    third = Grader(root, subs, grading, "--jobs", "4")
    wait_for(lambda: let_go(third), 300, "the third run did not finish")
    assert third.finish() == 0, third.output()
    assert third.output().count("(already graded)") == kept
    assert not any((grading / "tmp").iterdir())
    assert cell_scores(grading) == serial[0]
    assert rows(Course.at(root, grading)) == serial[1]
    assert digest(subs) == before, "a submission file was modified"


@pytest.mark.slow
def test_no_worker_or_kernel_outlives_the_grader(course, tmp_path):
    root, subs = course
    stuck = nbformat.read(subs / "ada" / NOTEBOOK, as_version=4)
    edit_cell(stuck, "mean", "def mean", "import time\ntime.sleep(120)\n\n\ndef mean")
    hand_in(tmp_path / "subs", "stuck", stuck)  # its kernel would run on for two minutes
    grading = tmp_path / "grading"
    for stop in (signal.SIGINT, signal.SIGKILL):
        grader = Grader(root, tmp_path / "subs", grading)
        grader.wait_until(lambda g=grader: any(is_kernel(p) for p in g.watch().values()),
                          "no kernel started")
        grader.process.send_signal(stop)
        assert grader.finish() == (130 if stop == signal.SIGINT else -stop)
        assert_all_gone(grader.seen, within=15)
    leftovers = list((grading / "tmp").iterdir())
    assert leftovers, "the SIGKILLed run left its worker folder"
    # The next run on this root, even one with nothing to grade, removes it first.
    assert grade(Course.at(root, grading), LAB, subs, students=["nobody"], progress=False) == []
    assert not any((grading / "tmp").iterdir())
