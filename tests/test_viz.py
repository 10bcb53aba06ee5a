"""The lesson pictures, drawn headlessly: what is on the axes, not how it looks."""

import subprocess
import sys

import numpy as np
import pytest

import gpulab  # noqa: F401  (decides the runner first)
from gpulab import hardware as hw
from gpulab import viz


def test_importing_gpulab_and_viz_loads_no_pyplot():
    code = ("import sys, gpulab; assert 'matplotlib' not in sys.modules, 'gpulab loads mpl'; "
            "import gpulab.hardware, gpulab.viz; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'viz loads pyplot'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_roofline_draws_one_roof_per_gpu_on_log_axes():
    gpus = ["A100 80GB SXM", "H100 SXM", "RTX 4090"]
    fig = viz.plot_roofline(gpus, "bf16", intensity_range=(0.1, 1000))
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    _, labels = ax.get_legend_handles_labels()
    assert len(labels) == 3
    for name, label in zip(gpus, labels, strict=True):
        assert label.startswith(name)
    for name, line in zip(gpus, ax.get_lines()[:3], strict=True):
        x, y = line.get_data()
        spec = hw.get_gpu(name)
        assert y.max() == pytest.approx(spec.bf16)  # the flat compute roof
        assert y[0] == pytest.approx(spec.bandwidth_gbps * x[0] / 1e3)  # the memory slope
    assert "bf16" in ax.get_ylabel()


def test_roofline_places_ops_and_their_measurements():
    ops = [("a+b", hw.elementwise_intensity(2, 1, "bf16"), 0.9),
           ("matmul", hw.gemm_intensity(4096, 4096, 4096), None)]
    fig = viz.plot_roofline("H100 SXM", "bf16", ops=ops)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["a+b", "matmul"]
    verticals = [line.get_xdata()[0] for line in ax.get_lines()[1:]]
    assert verticals == pytest.approx([ops[0][1], ops[1][1]])
    stars = [c.get_offsets() for c in ax.collections if len(c.get_offsets())]
    assert any(np.allclose(o, [[ops[0][1], 0.9]]) for o in stars), "measured op not plotted"
    assert ax.get_ylim()[0] < 0.9  # the measured point is inside the picture


def test_measured_roofline_is_dashed_and_labelled():
    m = hw.MeasuredRoofline(name="this CPU (measured)", device="cpu", bandwidth_gbps=20.0,
                            fp32=0.5)
    fig = viz.plot_roofline([m, "T4"], "fp32")
    lines = fig.axes[0].get_lines()
    assert lines[0].get_linestyle() == "--" and lines[1].get_linestyle() == "-"
    assert "measured" in fig.axes[0].get_legend_handles_labels()[1][0]


def test_roofline_refuses_a_dtype_a_gpu_lacks():
    with pytest.raises(ValueError, match="T4 has no bf16"):
        viz.plot_roofline(["A100 80GB SXM", "T4"], "bf16")


def test_waves_grid_fills_slots_in_order():
    grid = viz.waves_grid(5, 4)
    assert grid.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]


def test_plot_waves_shows_busy_and_idle_slots():
    fig = viz.plot_waves(144, "A100 80GB SXM")
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert image.shape == (2, 108) and image.sum() == 144
    assert "1.33 waves" in ax.get_title() and "67%" in ax.get_title()
    assert [t.get_text() for t in ax.texts] == ["idle: 72 slots"]
    full = viz.plot_waves(216, "A100 80GB SXM", blocks_per_sm=2).axes[0]
    assert full.get_images()[0].get_array().shape == (1, 216)
    assert len(full.texts) == 0, "a full last wave has no idle slots to point at"


def test_plot_wave_utilization_is_a_saw_tooth():
    fig = viz.plot_wave_utilization("A100 80GB SXM", 300, mark=(109,))
    ax = fig.axes[0]
    n, u = ax.get_lines()[0].get_data()
    assert u[n == 108][0] == 1.0 and u[n == 216][0] == 1.0
    assert u[n == 109][0] == pytest.approx(109 / 216)
    assert ax.texts[0].get_text() == "109 blocks: 50%"


def test_figures_render_to_png(tmp_path):
    fig = viz.plot_waves(10, "T4")
    fig.savefig(tmp_path / "waves.png")
    assert (tmp_path / "waves.png").stat().st_size > 1000


def test_memory_hierarchy_bars_are_the_spec_sheet_totals():
    ax = viz.plot_memory_hierarchy("H100 SXM").axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    assert widths == [256 * 2**10 * 132, 256 * 2**10 * 132, 50 * 2**20, 80e9]
    assert [t.get_text() for t in ax.texts] == ["33 MB", "33 MB", "50 MB", "80 GB"]
    assert ax.get_xscale() == "log"


def test_time_vs_size_draws_the_memory_roof():
    n_bytes = np.array([1e3, 1e6, 1e9])
    ax = viz.plot_time_vs_size(n_bytes, [2e-6, 3e-6, 0.1], bandwidth_gbps=10).axes[0]
    measured, roof = ax.get_lines()
    assert list(measured.get_ydata()) == [2e-6, 3e-6, 0.1]
    assert roof.get_ydata() == pytest.approx(n_bytes / 10e9)
    assert len(viz.plot_time_vs_size(n_bytes, [1, 2, 3]).axes[0].get_lines()) == 1
