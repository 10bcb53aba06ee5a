"""One technique verdict on both runners: Lab 1's technique checks trace the kernel in this
process on the cpu runner and in a simulator process of its own on the gpu runner
(gpulab/checks/harness/simulator_process.py). Here both paths judge the solution's kernels,
every known-wrong kernel of tests/test_checks_lab1*.py and the end-to-end mistakes of
grading_specs.LAB1, and must give the same verdict, message for message. The gpu runner's
printed speed, and how the subprocess path fails, are checked with the runner pretended.
"""

import dataclasses
import linecache
import threading

import pytest
import test_checks_lab1
import test_checks_lab1_technique
from grading_specs import LAB1
from lab_submissions import Lab, grade_id
from numba import cuda

import gpulab
from gpulab.checks.harness import technique
from gpulab.checks.harness.simulator_process import (
    Verdict,
    pack_request,
    take_request,
    verdicts_in_simulator,
)
from gpulab.checks.lab1 import (
    block_sum,
    check_block_sum_technique,
    histogram,
    matmul_tiled,
    scan,
    stencil,
    transpose,
)
from gpulab.sim.trace import MAX_THREADS_PER_BLOCK

pytestmark = [pytest.mark.lab1, pytest.mark.skipif(
    not gpulab.runner.simulator, reason="compares the cpu runner's path with the gpu runner's")]

# Each part's verdict, by the name of the solution's kernel; test kernels are named after it.
VERDICTS = {"transpose": transpose.technique_verdict, "block_sum": block_sum.technique_verdict,
            "matmul_tiled": matmul_tiled.technique_verdict,
            "histogram": histogram.technique_verdict, "stencil": stencil.technique_verdict,
            "block_scan": scan.technique_verdict}
PREFIXES = {"transpose": "transpose", "block_sum": "block_sum", "matmul": "matmul_tiled",
            "histogram": "histogram", "stencil": "stencil", "scan": "block_scan"}


def is_kernel(obj) -> bool:
    return hasattr(obj, "py_func") and hasattr(type(obj), "__getitem__") and not getattr(
        obj, "_device", False)


def test_kernels() -> dict[str, tuple[str, object]]:
    """'module.name' -> (part, kernel) for every kernel of the Lab 1 checker tests."""
    found = {}
    for module in (test_checks_lab1, test_checks_lab1_technique):
        for name, obj in vars(module).items():
            part = next((p for prefix, p in PREFIXES.items() if name.startswith(prefix)), None)
            if part and is_kernel(obj):
                found[f"{module.__name__}.{name}"] = (part, obj)
    return found


test_kernels.__test__ = False  # a helper, not a test


def notebook_kernels(nb, label: str) -> dict[str, tuple[str, object]]:
    """The graded kernels a notebook defines: its set-up and answer cells (and the ungraded
    ones they use, LAB1.context), run here as a kernel runs them, each cell's text in
    linecache as IPython keeps it."""
    namespace = {"__name__": "__main__"}
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        name = grade_id(cell) or cell.get("id", str(index))
        wanted = (meta and not meta.get("grade")) or name in LAB1.context
        if cell.cell_type != "code" or not wanted or name == "colab_setup":
            continue
        filename = f"/tmp/ipykernel_0/{label}-{name}.py"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True),
                                     filename)
        exec(compile(cell.source, filename, "exec"), namespace)
    return {f"{label}.{part}": (part, namespace[part]) for part in VERDICTS}


def outcome_here(part: str, kernel):
    try:
        VERDICTS[part](kernel)
    except AssertionError as error:
        return str(error)
    return None


def test_every_known_kernel_gets_the_same_verdict_in_a_simulator_process():
    lab = Lab(LAB1.name)
    kernels = test_kernels()
    kernels.update(notebook_kernels(lab.solution(), "solution"))
    for mistake in LAB1.mistakes:  # the end-to-end ones: each breaks one answer cell
        if mistake.cell in VERDICTS:
            label = f"mistake {mistake.student_id}"
            found = notebook_kernels(lab.with_mistake(mistake), label)
            kernels[f"{label}.{mistake.cell}"] = found[f"{label}.{mistake.cell}"]
    assert len(kernels) > 40 and {part for part, _ in kernels.values()} == set(VERDICTS)
    labels = list(kernels)
    request = pack_request([Verdict(VERDICTS[part], kernels[label][1])
                            for label in labels for part in [kernels[label][0]]])
    there = {}  # the simulator process runs beside this one
    worker = threading.Thread(target=lambda: there.update(zip(
        labels, take_request(request, timeout_s=900), strict=True)))
    worker.start()
    here = {label: outcome_here(*kernels[label]) for label in labels}
    worker.join()
    assert set(there) == set(labels), "the simulator process did not answer"
    different = {label: (here[label], there[label]) for label in labels
                 if here[label] != there[label]}
    assert not different, different
    passed = {label for label in labels if here[label] is None}
    assert {f"solution.{part}" for part in VERDICTS} <= passed  # the solution keeps its points
    assert not TECHNIQUE_MISTAKES & passed  # and each technique mistake loses them on both


# The known-wrong ways of tests/test_checks_lab1*.py that keep the values and lose the technique.
TECHNIQUE_MISTAKES = {
    f"test_checks_lab1.{name}" for name in ("transpose_naive", "transpose_unpadded",
                                            "transpose_padded")} | {
    f"test_checks_lab1_technique.{name}" for name in (
        "matmul_naive", "matmul_a_only", "block_sum_serial", "block_sum_strided",
        "block_sum_global_tree", "histogram_global", "stencil_global", "scan_serial")}


# ----------------------------------------------------------------------------- gpu runner


@pytest.fixture
def pretend_gpu(monkeypatch):
    """The gpu runner's path on this machine: kernels timed by a stand-in that says 2 ms for
    the learner's kernel and 5 ms for the yardstick."""
    monkeypatch.setattr(gpulab, "runner", dataclasses.replace(gpulab.runner, name="gpu"))

    def median_kernel_s(kernel, blocks, threads_per_block, make_args, repeat=20):
        return 5e-3 if kernel is block_sum._serial_block_sum else 2e-3

    monkeypatch.setattr(technique, "median_kernel_s", median_kernel_s)
    monkeypatch.setattr(block_sum, "SPEED_SIZE", 512)  # the yardstick's arrays, kept small


def test_the_gpu_runner_prints_the_measured_speed_and_grades_the_trace(pretend_gpu, capsys):
    check_block_sum_technique(test_checks_lab1_technique.block_sum_tree)
    assert capsys.readouterr().out.startswith(
        "Measured on this GPU, not graded: 2.0 ms at n=512, 2.50x the speed of thread 0 adding "
        "each block. The grade comes from the trace.")


def test_a_speed_that_cannot_be_measured_changes_no_verdict(pretend_gpu, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("no device")

    monkeypatch.setattr(technique, "median_kernel_s", broken)
    with pytest.raises(AssertionError, match=r"^Combine the threads' sums as a tree"):
        check_block_sum_technique(test_checks_lab1_technique.block_sum_serial)
    assert "Speed on this GPU not measured (RuntimeError: no device); not graded" in \
        capsys.readouterr().out


def test_a_kernel_that_reads_what_cannot_travel_is_told_so():
    lock = threading.Lock()

    @cuda.jit
    def block_sum_with_a_lock(out, x):
        if lock is None:
            out[0] = x[0]

    with pytest.raises(AssertionError, match=r"cannot be sent there: `lock` of "
                                             r"block_sum_with_a_lock .* is a lock"):
        verdicts_in_simulator([Verdict(block_sum.technique_verdict, block_sum_with_a_lock)])


def test_a_simulator_process_past_its_time_is_a_failure_that_says_so():
    with pytest.raises(AssertionError, match=r"ran past 0 s: look for a loop that never ends"):
        verdicts_in_simulator([Verdict(block_sum.technique_verdict,
                                       test_checks_lab1_technique.block_sum_tree)],
                              timeout_s=0.1)


def test_only_gpulab_checks_are_taken_as_verdicts():
    with pytest.raises(ValueError, match="is not a verdict of gpulab.checks"):
        verdicts_in_simulator([Verdict(outcome_here, test_checks_lab1_technique.block_sum_tree)])


def test_the_gpu_sandbox_leaves_room_for_the_simulator_process():
    """The simulator runs a Python thread per CUDA thread of a block; RLIMIT_NPROC counts them
    with the grading kernel's own threads (autograder/sandbox.py)."""
    from autograder.profiles import get_profile

    assert get_profile("gpu").max_processes >= 2 * MAX_THREADS_PER_BLOCK
