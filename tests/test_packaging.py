"""The two install paths (pip via pyproject.toml, conda via environment.yml) ask for the same
packages, and a CPU machine pins the small CPU build of torch."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name
SPEC = re.compile(r"^([A-Za-z0-9_.-]+)\s*(.*)$")


def parse(requirement: str) -> tuple[str, str]:
    name, spec = SPEC.match(requirement.strip()).groups()
    name = name.lower().replace("_", "-")
    return CONDA_NAMES.get(name, name), spec.replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["course"]
    return dict(parse(r) for r in reqs)


def conda_requirements() -> dict[str, str]:
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    plain = [d for d in deps if isinstance(d, str)]
    return dict(parse(d) for d in plain if not d.startswith(("python=", "pip")))


def test_environment_yml_matches_pyproject():
    pip_side, conda_side = pyproject_requirements(), conda_requirements()
    assert sorted(pip_side) == sorted(conda_side), (
        f"only in pyproject.toml: {sorted(set(pip_side) - set(conda_side))}; "
        f"only in environment.yml: {sorted(set(conda_side) - set(pip_side))}")
    for name, spec in pip_side.items():
        assert conda_side[name] == spec, f"{name}: pyproject {spec!r}, conda {conda_side[name]!r}"


def test_environment_yml_installs_gpulab_itself():
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict))
    assert "-e ." in pip_section


def test_cpu_constraints_pin_an_exact_torch_inside_the_project_range():
    pins = [line for line in (ROOT / "constraints/cpu.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert pins == [p for p in pins if p.startswith("torch==")] and len(pins) == 1
    pinned = tuple(int(x) for x in pins[0].split("==")[1].split("+")[0].split(".")[:2])
    floor = tuple(int(x) for x in pyproject_requirements()["torch"].removeprefix(">=").split("."))
    assert pinned >= floor


def test_makefile_uses_the_cpu_constraints_without_a_gpu():
    makefile = (ROOT / "Makefile").read_text()
    assert "nvidia-smi" in makefile and "-c constraints/cpu.txt" in makefile
