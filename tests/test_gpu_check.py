"""`make gpu-check` without a GPU: its plan, its refusal to pretend, its steps' verdicts and its
report. What it finds on a GPU is in docs/gpu-report.md once it has run on one."""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402
import lab1_measured  # noqa: E402
import nbformat  # noqa: E402
from gpu_check import Outcome, Step, report, run_step  # noqa: E402

from gpulab.checks import PACKAGES  # noqa: E402
from gpulab.env import nvidia_gpu_count  # noqa: E402

NO_GPU = pytest.mark.skipif(nvidia_gpu_count() > 0, reason="this machine has a GPU")


def check(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/gpu_check.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_plan_covers_tests_lessons_every_graded_notebook_and_the_benchmarks(tmp_path):
    names = [step.name for step in gpu_check.plan(tmp_path)]
    assert names == ["gpu tests", "lessons", *(f"grading {lab}" for lab in PACKAGES),
                     "lab1 kernels", "benchmarks"]
    for lab in PACKAGES:  # the solution and the release, handed in as two learners
        assert {p.name for p in (tmp_path / lab).iterdir()} == {"solution", "release"}
    grading = [s for s in gpu_check.plan(tmp_path, ("grading",))]
    assert len(grading) == len(PACKAGES)
    assert all("--runner" in s.command and "gpu" in s.command for s in grading)


def test_a_dry_run_lists_the_steps_and_runs_nothing():
    done = check("--dry-run", "--only", "lessons", "benchmarks")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("dry run: 2 steps, nothing run, no report written")
    assert "--nbval-lax lessons" in done.stdout and "benchmarks/run.py kernels" in done.stdout


def test_make_gpu_check_runs_the_check():
    done = subprocess.run(["make", "gpu-check", "GPU_CHECK_ARGS=--dry-run --only gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dry run: 1 step, nothing run" in done.stdout


@NO_GPU
def test_without_a_gpu_it_says_so_and_writes_no_report(tmp_path):
    done = check("--output", str(tmp_path / "report.md"))
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU here" in done.stdout and "nothing was run" in done.stdout
    assert not (tmp_path / "report.md").exists()


def test_a_step_passes_only_on_status_zero_with_what_it_must_print():
    python = (sys.executable, "-c")
    assert run_step(Step("ok", (*python, "print('solution 5 / 5')"), 30,
                         must_print=(r"(?m)^solution\s+5 / ",)), 60).passed
    wrong = run_step(Step("wrong", (*python, "print('solution 3 / 5')"), 30,
                          must_print=(r"(?m)^solution\s+5 / ",)), 60)
    assert not wrong.passed and "lacks" in wrong.why and "solution 3 / 5" in wrong.why
    crashed = run_step(Step("crash", (*python, "raise SystemExit(3)"), 30), 60)
    assert not crashed.passed and crashed.why.startswith("exit status 3")
    slow = run_step(Step("slow", (*python, "print('started', flush=True); "
                                  "import time; time.sleep(30)"), 30), 1)
    assert not slow.passed and slow.why.startswith("stopped at its limit of 1 s")
    assert "started" in slow.why
    late = run_step(Step("late", (*python, "pass"), 30), 0)
    assert not late.passed and "budget was spent" in late.why


def test_the_report_dates_itself_and_quotes_what_failed():
    ok, bad = Step("lessons", ("x",), 1), Step("grading quiz", ("y",), 1)
    text = report({"GPU": "NVIDIA H100 80GB HBM3", "torch": "2.13.0"},
                  [Outcome(ok, True, 61.2), Outcome(bad, False, 3.0, "exit status 1\nboom")],
                  datetime.datetime(2026, 11, 27, 9, 30))
    assert "run 2026-11-27 09:30 UTC: 1 of 2 steps passed" in text
    assert "- GPU: NVIDIA H100 80GB HBM3" in text
    assert "| lessons | pass | 61 |" in text and "| grading quiz | FAIL | 3 |" in text
    assert "### grading quiz" in text and "boom" in text


def test_a_quoted_step_puts_what_it_printed_in_the_report():
    step = Step("lab1 kernels", ("x",), 1, quote=True)
    ran = run_step(Step("lab1 kernels", (sys.executable, "-c", "print('saxpy 1 ms measured')"),
                        30, must_print=("measured",), quote=True), 60)
    assert ran.passed and ran.output == "saxpy 1 ms measured"
    text = report({}, [Outcome(step, True, 40.0, output=ran.output)],
                  datetime.datetime(2026, 11, 27, 9, 30))
    assert "## lab1 kernels\n\n```\nsaxpy 1 ms measured\n```" in text


def test_the_lab1_kernels_step_runs_the_solutions_answers_then_its_performance_report(tmp_path):
    nb = nbformat.read(lab1_measured.NOTEBOOK, as_version=4)
    cells = lab1_measured.cells_to_run(nb)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") or c.get("id") for c in cells]
    assert ids[0] == "imports" and ids[-1] == "report"
    assert {"block_sum", "transpose", "matmul_tiled", "histogram", "stencil",
            "block_scan"} <= set(ids)
    assert not {"colab_setup", "waves"} & set(ids)
    assert not any(c.metadata.get("nbgrader", {}).get("grade") for c in cells)  # no tests
    report_cell = cells[-1].source
    assert "MEASURED on this GPU at full size" in report_cell  # what the step must print
    (step,) = gpu_check.plan(tmp_path, ("lab1",))
    assert step.quote and step.must_print == (r"MEASURED on this GPU at full size",)
