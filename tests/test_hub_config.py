"""The hub's learner configuration (hub/learner/) against the installed nbgrader: learners keep
Validate and the Assignments tab (with the menu that opens it), and lose every other tool, so a
new nbgrader plugin shows up here instead of in a learner's menu bar. In-process, no hub."""

from __future__ import annotations

import json

from lab_server import ROOT
from test_lab_roles import installed_plugins, installed_server_extensions

HUB_LEARNER = ROOT / "hub" / "learner"
LEARNER_KEEPS = {"@jupyter/nbgrader:validate-assignment", "@jupyter/nbgrader:assignment-list",
                 "@jupyter/nbgrader:menu"}  # the menu shows only the commands that exist
LEARNER_KEEPS_SERVER = {"nbgrader.server_extensions.validate_assignment",
                        "nbgrader.server_extensions.assignment_list"}


def test_hub_learners_keep_validate_and_the_assignments_tab_and_nothing_else():
    page_config = json.loads((HUB_LEARNER / "labconfig" / "page_config.json").read_text())
    disabled = {name for name, off in page_config["disabledExtensions"].items() if off}
    plugins = installed_plugins()
    assert LEARNER_KEEPS <= plugins, plugins
    assert disabled == plugins - LEARNER_KEEPS


def test_hub_learners_keep_the_exchanges_server_extension_and_validate_only():
    (config,) = (HUB_LEARNER / "jupyter_server_config.d").glob("*.json")
    extensions = json.loads(config.read_text())["ServerApp"]["jpserver_extensions"]
    off = {name for name, on in extensions.items() if not on}
    installed = installed_server_extensions()
    assert LEARNER_KEEPS_SERVER <= installed, installed
    assert off == installed - LEARNER_KEEPS_SERVER
