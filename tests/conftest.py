"""Shared pytest setup: gpulab is imported first so Numba's simulator is chosen before any
test imports numba.cuda, `gpu` tests skip themselves where no GPU is usable, and `make test`'s
workers share the work evenly."""

import pytest

import gpulab

collect_ignore_glob = ["fixtures/*"]

# The units that take minutes on a 2-core machine, longest first: they start first, so that
# no long one starts last and runs alone while the other worker idles.
LONGEST_FIRST = ("grading-lab3", "grading-capstone", "grading-lab4", "grading-lab5",
                 "grading-quiz", "grading-lab1", "grading-lab2")


def unit(item) -> str:
    """The part of the suite that runs on one worker under `--dist loadgroup` (make test): a
    file, as `--dist loadfile` would make it (a notebook's cells share a kernel), except the
    grading tests, a unit per notebook's batch (tests that read the `graded` fixture)."""
    callspec = getattr(item, "callspec", None)
    spec = callspec.params.get("spec") if callspec else None
    if spec is not None and "graded" in item.fixturenames:
        return f"grading-{spec.short}"
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(unit(item)))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit(item), len(rank)))  # stable: files keep order
    if gpulab.runner.name == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a usable NVIDIA GPU (the gpu runner)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
