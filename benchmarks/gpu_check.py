"""Everything the course can only show on an NVIDIA GPU, in one command (`make gpu-check`), sized
for a short slot on a borrowed or rented GPU (about 8 minutes on one H100), with a dated report.

    python benchmarks/gpu_check.py                     # run it all, write docs/gpu-report.md
    python benchmarks/gpu_check.py --only lessons      # one step (or several)
    python benchmarks/gpu_check.py --dry-run           # say what would run; runs nothing

The steps, each under a time limit of its own so that one stuck step cannot eat the slot:
    gpu tests   `pytest -m gpu`: the tests that skip themselves without a GPU
    lessons     every lesson under nbval-lax on the gpu runner (outputs differ by design there)
    grading     each graded notebook's solution and untouched release, graded with --runner gpu:
                full marks for the solution (its autograded points), zero for the release
    lab1 kernels  each Lab 1 solution kernel at full size, measured against the cost model's
                modeled time (benchmarks/lab1_measured.py), quoted in the report
    benchmarks  benchmarks/run.py's GPU rows: kernels (measured against the cost model's
                modeled time), training, memory, roofline

On a machine without an NVIDIA GPU it says so and exits 0, writing nothing: a report only ever
holds what a GPU ran.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "gpu-report.md"
TAIL_LINES = 12  # of a failed step's output, quoted in the report
BUDGET_S = 480  # the whole check: a step that would start after it is reported as not run
# benchmarks/run.py topics with rows measured on the GPU (the others measure the grader or CPU).
GPU_BENCHMARKS = ("kernels", "cost_model", "training", "memory", "roofline")


@dataclass(frozen=True)
class Step:
    """One command of the check, with its time limit."""

    name: str
    command: tuple[str, ...]
    limit_s: int
    # Lines the output must hold for the step to pass, beyond its exit status of 0.
    must_print: tuple[str, ...] = ()
    quote: bool = False  # the report quotes the output of a step that passed


@dataclass(frozen=True)
class Outcome:
    step: Step
    passed: bool
    seconds: float
    why: str = ""  # for a failure: what went wrong, and the output's last lines
    output: str = ""  # what a passing step that the report quotes printed


def grading_steps(submissions: Path) -> list[Step]:
    """Each graded notebook's solution and release handed in as two learners, and graded."""
    from gpulab.checks import PACKAGES, assignment

    steps = []
    for lab in PACKAGES:
        folder = submissions / lab
        for learner, source in (("solution", ROOT / "solutions"), ("release", ROOT / "labs")):
            (folder / learner).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / lab / f"{lab}.ipynb", folder / learner / f"{lab}.ipynb")
        points = sum(assignment(lab).points.values())
        steps.append(Step(
            f"grading {lab}",
            (sys.executable, "-m", "autograder", "grade", lab, str(folder), "--runner", "gpu",
             "--course-dir", str(submissions / f"{lab}-grading"), "--jobs", "2"),
            limit_s=240,
            must_print=(rf"(?m)^solution\s+{points:g} / ", r"(?m)^release\s+0 / ")))
    return steps


def plan(submissions: Path, only: tuple[str, ...] = ()) -> list[Step]:
    python = sys.executable
    steps = [
        Step("gpu tests", (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           "tests"), limit_s=180),
        # Four lessons at once (a GPU machine has the cores), a notebook's cells on one worker.
        Step("lessons", (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4",
                         "--dist", "loadfile", "--nbval-lax", "lessons"), limit_s=300),
        *grading_steps(submissions),
        Step("lab1 kernels", (python, "benchmarks/lab1_measured.py"), limit_s=180,
             must_print=(r"MEASURED on this GPU at full size",), quote=True),
        Step("benchmarks", (python, "benchmarks/run.py", *GPU_BENCHMARKS), limit_s=240),
    ]
    return [s for s in steps if not only or any(s.name.startswith(o) for o in only)]


def run_step(step: Step, left_s: float) -> Outcome:
    """Run `step` for at most its limit, or `left_s` of the check's budget if that is less."""
    limit = min(step.limit_s, left_s)
    if limit <= 0:
        return Outcome(step, False, 0.0, "not run: the check's time budget was spent")
    started = time.perf_counter()
    try:
        done = subprocess.run(step.command, cwd=ROOT, capture_output=True, text=True,
                              timeout=limit)
    except subprocess.TimeoutExpired as stopped:
        output = stopped.stdout or ""  # bytes, whatever `text` said (CPython's way)
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        return Outcome(step, False, time.perf_counter() - started,
                       f"stopped at its limit of {limit:.0f} s\n{tail(output)}")
    seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    if done.returncode != 0:
        return Outcome(step, False, seconds, f"exit status {done.returncode}\n{tail(output)}")
    missing = [pattern for pattern in step.must_print if not re.search(pattern, output)]
    if missing:
        return Outcome(step, False, seconds,
                       f"the output lacks {', '.join(map(repr, missing))}\n{tail(output)}")
    return Outcome(step, True, seconds, output=done.stdout.strip() if step.quote else "")


def tail(output: str) -> str:
    return "\n".join(output.strip().splitlines()[-TAIL_LINES:])


def machine_facts() -> dict[str, str]:
    """The device and the versions a reader needs to compare two reports."""
    import numba
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True)
    return {
        "GPU": smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "unknown",
        "CUDA (torch's build)": str(torch.version.cuda),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "Python": platform.python_version(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip() or "unknown",
    }


def report(facts: dict[str, str], outcomes: list[Outcome], when: datetime.datetime) -> str:
    passed = sum(o.passed for o in outcomes)
    lines = ["# GPU check", "",
             f"`make gpu-check`, run {when:%Y-%m-%d %H:%M} UTC: {passed} of {len(outcomes)} steps "
             "passed.", ""]
    lines += [f"- {key}: {value}" for key, value in facts.items()]
    lines += ["", "| step | result | seconds |", "|---|---|---|"]
    lines += [f"| {o.step.name} | {'pass' if o.passed else 'FAIL'} | {o.seconds:.0f} |"
              for o in outcomes]
    for o in outcomes:
        if o.passed and o.output:
            lines += ["", f"## {o.step.name}", "", "```", o.output, "```"]
    failed = [o for o in outcomes if not o.passed]
    if failed:
        lines += ["", "## What failed", ""]
        for o in failed:
            lines += [f"### {o.step.name}", "", "```", o.why, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=(),
                        help="steps whose names start with these (gpu, lessons, grading ...)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    parser.add_argument("--output", type=Path, default=REPORT, help="where the report goes")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="seconds for the whole check (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gpulab.env import nvidia_gpu_count

    gpus = nvidia_gpu_count()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        steps = plan(Path(scratch), tuple(args.only))
        if args.dry_run:
            print(f"dry run: {len(steps)} step{'s' * (len(steps) != 1)}, nothing run, "
                  f"no report written ({gpus} NVIDIA GPU(s) here)")
            for step in steps:
                print(f"  {step.name} (limit {step.limit_s} s): {' '.join(step.command)}")
            return 0
        if gpus == 0:
            print("no NVIDIA GPU here (the CUDA driver reports none): nothing was run and "
                  f"{args.output} is unchanged. Run `make gpu-check` on a machine with one.")
            return 0
        outcomes, deadline = [], time.monotonic() + args.budget_s
        for step in steps:
            print(f"{step.name} ...", flush=True)
            outcomes.append(run_step(step, deadline - time.monotonic()))
            print(f"  {'pass' if outcomes[-1].passed else 'FAIL'} in "
                  f"{outcomes[-1].seconds:.0f} s", flush=True)
    now = datetime.datetime.now(datetime.UTC)
    args.output.write_text(report(machine_facts(), outcomes, now))
    print(f"report: {args.output}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
