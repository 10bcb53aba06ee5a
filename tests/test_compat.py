"""gpulab.compat: the aliases numba-cuda needs exist after `import gpulab`."""

import numpy as np

import gpulab  # noqa: F401  (installs the fixes)
from gpulab import compat


def test_row_stack_is_vstack_after_import():
    assert np.row_stack(([1, 2], [3, 4])).tolist() == [[1, 2], [3, 4]]


def test_install_restores_a_removed_alias(monkeypatch):
    monkeypatch.delattr(np, "row_stack", raising=False)
    assert "row_stack" not in vars(np)
    compat.install()
    assert np.row_stack is np.vstack


def test_install_keeps_an_existing_alias(monkeypatch):
    marker = object()
    monkeypatch.setattr(np, "row_stack", marker, raising=False)
    compat.install()
    assert np.row_stack is marker
