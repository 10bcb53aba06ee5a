"""The GitHub Actions workflows of README's CI recipe: valid YAML, each runs `make test`, one on a
GitHub-hosted CPU machine and one on a self-hosted GPU machine with GPULAB_RUNNER=gpu."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(workflow, dict) and workflow.get("jobs"), f"{name}: no jobs"
    # YAML 1.1 reads the key `on` as the boolean True; GitHub reads it as "on".
    assert "on" in workflow or True in workflow, f"{name}: no `on:` trigger"
    return workflow


def make_test_steps(workflow: dict) -> list[tuple[dict, dict]]:
    """(job, step) for every step that runs `make test`."""
    return [(job, step) for job in workflow["jobs"].values() for step in job.get("steps", [])
            if "make test" in str(step.get("run", ""))]


def env_of(workflow: dict, job: dict, step: dict) -> dict:
    """The environment a step sees: workflow, then job, then step (the innermost wins)."""
    return {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}


def labels(job: dict) -> list[str]:
    runs_on = job["runs-on"]
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


@pytest.mark.parametrize("path", sorted(WORKFLOWS.glob("*.y*ml")), ids=lambda p: p.name)
def test_every_workflow_checks_out_then_runs_make_test(path):
    workflow = load(path.name)
    found = make_test_steps(workflow)
    assert found, f"{path.name} never runs `make test`, the course's one CI command"
    for job, step in found:
        steps = job["steps"]
        uses = [s.get("uses", "") for s in steps[: steps.index(step)]]
        assert any(u.startswith("actions/checkout@") for u in uses), (
            f"{path.name}: `make test` runs before actions/checkout, on an empty folder")


def test_cpu_workflow_runs_on_a_github_hosted_machine():
    workflow = load("tests-cpu.yml")
    for job, step in make_test_steps(workflow):
        assert not {"self-hosted", "gpu"} & set(labels(job))
        assert env_of(workflow, job, step).get("GPULAB_RUNNER") == "cpu"


def test_gpu_workflow_runs_on_a_self_hosted_gpu_machine_as_the_gpu_runner():
    workflow = load("tests-gpu.yml")
    found = make_test_steps(workflow)
    assert found
    for job, step in found:
        assert {"self-hosted", "gpu"} <= set(labels(job)), labels(job)
        assert env_of(workflow, job, step).get("GPULAB_RUNNER") == "gpu", (
            "without GPULAB_RUNNER=gpu a broken driver would quietly test the simulator")
