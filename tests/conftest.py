"""Shared pytest setup: gpulab is imported first so Numba's simulator is chosen before any
test imports numba.cuda, and `gpu` tests skip themselves where no GPU is usable."""

import pytest

import gpulab

collect_ignore_glob = ["fixtures/*"]


def pytest_collection_modifyitems(config, items):
    if gpulab.runner.name == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a usable NVIDIA GPU (the gpu runner)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
