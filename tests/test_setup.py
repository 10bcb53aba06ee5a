"""The commands the README shows work as a newcomer would type them."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.mark.slow
def test_make_lab_serves_the_lessons_and_stops_cleanly(tmp_path):
    port, token = free_port(), "gpulab-test"
    args = (f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 "
            f"--IdentityProvider.token={token} --ServerApp.open_browser=False")
    environ = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path))
    server = subprocess.Popen(["make", "lab", f"JUPYTER_ARGS={args}"], cwd=ROOT, env=environ,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/contents/lessons?token={token}"
    try:
        deadline, listing = time.monotonic() + 120, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                listing = get_json(url)
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"JupyterLab never answered:\n{server.stdout.read()}"
        names = {item["name"] for item in listing["content"]}
        assert any(n.startswith("01_") and n.endswith(".ipynb") for n in names), names
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # jupyter shuts down on SIGTERM, no prompt
        server.wait(timeout=30)
    with pytest.raises(OSError):  # the server is gone and the port is closed
        socket.create_connection(("127.0.0.1", port), timeout=1)
    leftover = subprocess.run(["pgrep", "-g", str(server.pid)], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "processes survived `make lab` shutdown"


def readme_commands() -> list[str]:
    """Every shell command shown in README.md code blocks (lines after a `$ ` prompt)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S)
    return [line[2:].strip() for b in blocks for line in b.splitlines() if line.startswith("$ ")]


# Each README command and the test that exercises it. A command added to the README without a
# test here makes test_every_readme_command_is_exercised fail.
EXERCISED = {
    "make lab": "test_make_lab_serves_the_lessons_and_stops_cleanly",
    "make lab-instructor": "tests/test_lab_roles.py (the learner and the instructor launches)",
    "make test": "CI runs it (.ci/run); test_make_test_runs_pytest checks what it runs",
    "python -m gpulab doctor": "tests/test_doctor.py::test_doctor_names_runner_and_simulator",
    "make doctor": "test_make_targets_are_defined",
    "make bench": "test_bench_runs_quick",
    "make lint": "test_lint_is_clean",
    "make gpu-check": "tests/test_gpu_check.py::test_make_gpu_check_runs_the_check",
    # The instructors' commands, run end to end by the autograder and lab grading tests.
    "python -m autograder release": "tests/test_autograder_release.py",
    "python -m autograder grade": "tests/grading_checks.py, tests/test_autograder_parallel.py",
    "python -m autograder feedback": "tests/grading_checks.py",
    "python -m autograder export": "tests/grading_checks.py, tests/test_autograder_shards.py",
    "python -m autograder merge": "tests/test_autograder_shards.py",
}
AUTOGRADER = "python -m autograder "


def exercised_by(command: str) -> str | None:
    if command.startswith(AUTOGRADER):
        return EXERCISED.get(" ".join(command.split()[:4]))
    return EXERCISED.get(command)


def test_every_readme_command_is_exercised():
    commands = readme_commands()
    assert "make lab" in commands and "make test" in commands
    missing = [c for c in commands if exercised_by(c) is None]
    assert not missing, f"README shows commands no test exercises: {missing}"


def test_readme_autograder_commands_parse():
    from autograder.cli import build_parser

    parser = build_parser()
    commands = [c for c in readme_commands() if c.startswith(AUTOGRADER)]
    assert {c.split()[3] for c in commands} >= {"release", "grade", "feedback", "export", "merge"}
    for command in commands:
        parser.parse_args(command.split()[3:])  # SystemExit (a failed test) if the README is stale


def test_make_test_runs_pytest():
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    assert "pytest" in plan.stdout
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in ci


def test_make_targets_are_defined():
    for target in ("lab", "test", "bench", "doctor", "lint"):
        plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert plan.returncode == 0, f"make {target}: {plan.stderr}"


def test_install_is_idempotent():
    plan = subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True, text=True)
    assert "pip install" not in plan.stdout, "a second `make` would reinstall everything"


def test_install_compiles_the_course_where_python_would_not():
    """Under PYTHONDONTWRITEBYTECODE (CI, containers) every process would compile gpulab's
    sources again: `make install` writes their bytecode itself."""
    plan = subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True, text=True)
    compile_line = next((line for line in plan.stdout.splitlines() if "compileall" in line), "")
    assert {"gpulab", "autograder"} <= set(compile_line.split()), plan.stdout


def test_lint_is_clean():
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run([str(ruff), "check", "gpulab", "autograder", "tests", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_bench_runs_quick():
    # About 160 CPU-seconds; the limit only stops a hang, and a shared machine (two `make
    # test` runs side by side on 2 cores) took over 600 s.
    done = subprocess.run([sys.executable, "benchmarks/run.py", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "benchmark" in done.stdout and "metric" in done.stdout
