"""`make lab` hides nbgrader's instructor tools from learners; `make lab-instructor` keeps them.

nbgrader installs, for everyone using the environment, six JupyterLab plugins and four server
extensions. Learners need one of each: Validate (its toolbar button and its handler). The
learner's launch turns the rest off with jupyter-config/learner/, for that launch only. These
tests read what to expect from the installed nbgrader, so a new nbgrader plugin shows up here
instead of in a learner's menu bar.
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib.metadata import distribution
from pathlib import Path

import pytest
from lab_server import ROOT, running_lab

LEARNER_CONFIG = ROOT / "jupyter-config" / "learner"
VALIDATE_PLUGIN = "@jupyter/nbgrader:validate-assignment"
VALIDATE_EXTENSION = "nbgrader.server_extensions.validate_assignment"
PLUGIN_ID = re.compile(r'"(@jupyter/nbgrader:[a-z-]+)"')


def nbgrader_files(part: str) -> list[Path]:
    """The installed nbgrader's files whose path contains `part`."""
    return [Path(f.locate()) for f in distribution("nbgrader").files if part in str(f)]


def installed_plugins() -> set[str]:
    """Every plugin id nbgrader's installed JupyterLab extension names (its bundle's strings)."""
    scripts = [p for p in nbgrader_files("labextensions/@jupyter/nbgrader/static/")
               if p.suffix == ".js"]
    return {plugin for path in scripts for plugin in PLUGIN_ID.findall(path.read_text())}


def installed_server_extensions() -> set[str]:
    """The server extensions nbgrader enables when it is installed."""
    (enabling,) = nbgrader_files("jupyter_server_config.d/nbgrader.json")
    return set(json.loads(enabling.read_text())["ServerApp"]["jpserver_extensions"])


def learner_disabled_plugins() -> set[str]:
    page_config = json.loads((LEARNER_CONFIG / "labconfig" / "page_config.json").read_text())
    return {name for name, off in page_config["disabledExtensions"].items() if off}


def learner_disabled_server_extensions() -> set[str]:
    (config,) = (LEARNER_CONFIG / "jupyter_server_config.d").glob("*.json")
    extensions = json.loads(config.read_text())["ServerApp"]["jpserver_extensions"]
    return {name for name, on in extensions.items() if not on}


def test_learner_launch_turns_off_every_nbgrader_plugin_but_validate():
    plugins = installed_plugins()
    assert {VALIDATE_PLUGIN, "@jupyter/nbgrader:menu", "@jupyter/nbgrader:formgrader",
            "@jupyter/nbgrader:create-assignment"} <= plugins, f"nbgrader's bundle names {plugins}"
    assert learner_disabled_plugins() == plugins - {VALIDATE_PLUGIN}


def test_learner_launch_turns_off_every_nbgrader_server_extension_but_validate():
    extensions = installed_server_extensions()
    assert VALIDATE_EXTENSION in extensions, extensions
    assert learner_disabled_server_extensions() == extensions - {VALIDATE_EXTENSION}


def make_plan(target: str) -> str:
    plan = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
    assert plan.returncode == 0, f"make {target}: {plan.stderr}"
    return plan.stdout


def test_only_the_learners_launch_reads_the_learner_config():
    assert f"JUPYTER_CONFIG_PATH=\"{LEARNER_CONFIG}" in make_plan("lab")
    assert "jupyter-config" not in make_plan("lab-instructor")


@pytest.mark.slow
def test_learner_and_instructor_jupyterlab_serve_what_each_needs(tmp_path):
    with running_lab("lab", tmp_path, tmp_path / "learner") as lab:
        assert set(lab.page_config()["disabledExtensions"]) >= learner_disabled_plugins()
        assert lab.status("formgrader") == 404
        assert lab.status("assignments/validate") != 404  # Validate's handler is there
    with running_lab("lab-instructor", tmp_path, tmp_path / "instructor") as lab:
        assert not set(lab.page_config()["disabledExtensions"]) & installed_plugins()
        assert lab.status("formgrader") == 200
