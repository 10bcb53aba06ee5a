"""The interactive explorers, headlessly: set controls (as values and through their widgets),
check what each computes against the library and against numbers worked out by hand, and
check the static fallback that committed lessons show and nbval compares."""

import base64
import subprocess
import sys

import pytest

import gpulab  # noqa: F401  (decides the runner first)
from gpulab import hardware as hw
from gpulab.distributed import schedule as sched
from gpulab.explorers import (
    launch_waves,
    memory_explorer,
    pipeline_explorer,
    roofline_explorer,
    waves_explorer,
    widgets_available,
)
from gpulab.explorers.base import WIDGET_VIEW
from gpulab.memory import estimate_transformer, model_states, transformer_params

EXPLORERS = [roofline_explorer, waves_explorer, pipeline_explorer, memory_explorer]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def shown_text(explorer) -> str:
    """The text the live view shows under the controls."""
    return "".join(o["text"] for o in explorer.outputs if o["output_type"] == "stream")


def shown_pictures(explorer) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for o in explorer.outputs
            if "image/png" in o.get("data", {})]


# --- the roofline ------------------------------------------------------------------------------

def test_roofline_defaults_by_hand():
    p = roofline_explorer(interactive=False).result
    # matmul 4096^3 in bf16: 2 n^3 FLOPs over 3 n^2 elements of 2 bytes = n/3 FLOP/byte.
    assert p.flops == 2 * 4096**3 and p.n_bytes == 3 * 4096**2 * 2
    assert p.bound.intensity == pytest.approx(4096 / 3)
    assert p.bound.ridge == pytest.approx(312e12 / 2039e9)  # A100 80GB: 153 FLOP/byte
    assert p.bound.regime == "compute"
    assert p.bound.time_s == pytest.approx(2 * 4096**3 / 312e12)  # 440 us
    assert p.attainable_tflops == pytest.approx(312)


def test_roofline_widgets_move_the_op_off_the_compute_roof():
    ex = roofline_explorer(interactive=True)
    ex.widgets["op"].value = "softmax"  # what a learner's click does
    p = ex.result
    assert ex.values["op"] == "softmax"
    # softmax: 5 FLOPs per element over one read and one write of 2 bytes: 1.25 FLOP/byte.
    assert p.bound.intensity == pytest.approx(1.25) and p.bound.regime == "memory"
    assert p.bound.time_s == pytest.approx(2 * 4096**2 * 2 / 2039e9)  # 32.9 us
    assert "memory-bound" in shown_text(ex) and "1.25 FLOP/byte" in shown_text(ex)
    assert shown_pictures(ex)[0].startswith(PNG_MAGIC)


@pytest.mark.parametrize("op, m, n, k, dtype", [
    ("matmul", 1, 8192, 8192, "fp16"), ("matmul", 512, 1024, 64, "fp8"),
    ("add", 4096, 4096, 1, "fp32"), ("layernorm", 8192, 1024, 1, "bf16"),
    ("softmax", 64, 2048, 1, "fp32")])
def test_roofline_matches_the_library(op, m, n, k, dtype):
    ex = roofline_explorer(interactive=False, gpu="H100 SXM").set(op=op, m=m, n=n, k=k,
                                                                 dtype=dtype)
    want = {"matmul": lambda: hw.gemm_flops_bytes(m, n, k, dtype),
            "add": lambda: (m * n, 3 * m * n * hw.DTYPE_BYTES[dtype]),
            "layernorm": lambda: hw.layernorm_flops_bytes(m, n, dtype),
            "softmax": lambda: hw.softmax_flops_bytes(m, n, dtype)}[op]()
    p = ex.result
    assert (p.flops, p.n_bytes) == want
    assert p.bound == hw.bound(*want, "H100 SXM", dtype)
    assert p.attainable_tflops == pytest.approx(
        hw.attainable_tflops("H100 SXM", dtype, p.bound.intensity))


def test_roofline_says_why_a_gpu_cannot_run_a_dtype():
    ex = roofline_explorer(interactive=True, gpu="T4")  # Turing has no bf16 tensor cores
    ex.widget()
    assert "T4 has no bf16" in ex.error and "fp16" in ex.error
    assert "no result for these values" in shown_text(ex) and not shown_pictures(ex)
    ex.set(dtype="fp16")  # through the widget, since it is built: the view follows
    assert ex.error is None and "65 TFLOP/s" in shown_text(ex)


# --- launch configuration and waves -------------------------------------------------------------

def test_waves_defaults_by_hand():
    r = waves_explorer(interactive=False).result
    # 36,864 / 256 = 144 blocks on the A100's 108 SMs: 1.33 waves run as 2, 144/216 busy.
    assert r.blocks == 144 and r.idle_threads == 0
    assert r.waves.waves_ceil == 2 and r.waves.tail_blocks == 36
    assert r.waves.utilization == pytest.approx(2 / 3)


def test_waves_widgets_change_the_launch():
    ex = waves_explorer(interactive=True)
    ex.widgets["threads_per_block"].value = 128  # 288 blocks: 2.67 waves, run as 3
    assert ex.result.waves == hw.waves(288, "A100 80GB SXM")
    assert ex.result.waves.utilization == pytest.approx(288 / 324)
    ex.widgets["n_elements"].value = 1000  # 8 blocks of 128, the last with 24 idle threads
    ex.widgets["blocks_per_sm"].value = 2
    r = ex.result
    assert (r.blocks, r.idle_threads, r.waves.slots) == (8, 24, 216)
    assert "24 idle threads" in shown_text(ex) and "2 resident blocks per SM" in shown_text(ex)


def test_roofline_greys_out_k_unless_the_op_is_a_matmul():
    ex = roofline_explorer(interactive=True)
    assert not ex.widgets["k"].disabled
    ex.widgets["op"].value = "softmax"
    assert ex.widgets["k"].disabled


def test_waves_reject_launches_cuda_would_reject():
    with pytest.raises(ValueError, match="not offered; choose one of 32, 64"):
        waves_explorer(interactive=False).set(threads_per_block=100)
    with pytest.raises(ValueError, match="multiple of the warp"):  # the function, called alone
        launch_waves(threads_per_block=100)
    ex = waves_explorer(interactive=False, n_elements=2**40, threads_per_block=32)
    assert "grid limit" in ex.error and "grid-stride" in ex.error
    # Many waves: the picture is the utilization saw tooth, not one row per wave.
    big = waves_explorer(interactive=False, n_elements=2**24)
    assert big.result.waves.waves_ceil > 48 and "Tail effect" in big.figure().axes[0].get_title()


# --- pipeline schedules ------------------------------------------------------------------------

def test_pipeline_defaults_by_hand():
    s = pipeline_explorer(interactive=False).result
    # 1F1B, p=4, m=8, forward 1, backward 2: makespan (m + p - 1)(1 + 2) = 33, bubble 3/11.
    assert (s.name, s.makespan) == ("1F1B", 33)
    assert s.bubble_fraction == pytest.approx(3 / 11)
    assert s.peak_in_flight == [4, 3, 2, 1]


def test_pipeline_widgets_switch_schedules():
    ex = pipeline_explorer(interactive=True)
    ex.widgets["schedule"].value = "GPipe"  # same bubble, every stage holds all m
    assert ex.result.peak_in_flight == [8, 8, 8, 8]
    assert ex.result.bubble_fraction == pytest.approx(3 / 11)
    ex.widgets["schedule"].value = "interleaved 1F1B"  # v=2 halves the bubble: 3/19
    assert ex.result.bubble_fraction == pytest.approx(3 / 19)
    ex.set(pp_size=8, n_microbatches=16, n_chunks=4)  # moves the widgets, renders once
    assert [ex.widgets[n].value for n in ("pp_size", "n_microbatches", "n_chunks")] == [8, 16, 4]
    want = sched.schedule_interleaved_1f1b(8, 16, 4)
    assert ex.result.actions == want.actions
    assert ex.result.bubble_fraction == pytest.approx(sched.bubble_fraction_theory(8, 16, 4))
    assert "7/71" in shown_text(ex)


def test_pipeline_greys_out_v_unless_the_schedule_interleaves():
    ex = pipeline_explorer(interactive=True)  # 1F1B ignores v: its slider is greyed out
    assert ex.widgets["n_chunks"].disabled
    ex.widgets["schedule"].value = "interleaved 1F1B"
    assert not ex.widgets["n_chunks"].disabled
    ex.set(schedule="GPipe")
    assert ex.widgets["n_chunks"].disabled
    assert not any(w.disabled for n, w in ex.widgets.items() if n != "n_chunks")


def test_pipeline_explains_an_interleaving_it_cannot_build():
    ex = pipeline_explorer(interactive=False, schedule="interleaved 1F1B", pp_size=3)
    assert "multiple of pp_size" in ex.error and "m=8, p=3" in ex.error
    assert ex.figure() is None and "image/png" not in ex._repr_mimebundle_()


# --- memory ------------------------------------------------------------------------------------

N_6_7B = transformer_params(32, 4096, 50257, 2048)


def test_memory_defaults_by_hand():
    plan = memory_explorer(interactive=False).result
    # The GPT-3 6.7B shape: 2 V C + T C + L (12 C^2 + 13 C) + 2 C parameters.
    assert plan.estimate.n_params == N_6_7B == 6_864_257_024
    states = plan.estimate.model_states()
    assert states.total_bytes == 16 * N_6_7B  # mixed precision + Adam: 2 + 2 + 12 bytes
    assert not plan.fits  # 102 GiB of model states alone on an 80 GB H100


def test_memory_widgets_shard_and_checkpoint():
    ex = memory_explorer(interactive=True)
    ex.widgets["zero_stage"].value = 3
    assert "world_size >= 2" in ex.error  # ZeRO on one GPU shards over nothing
    ex.widgets["world_size"].value = 8
    plan = ex.result
    # ZeRO-3 over 8 ranks: each keeps 1/8 of 16 bytes per parameter: 2 bytes.
    assert plan.estimate.model_states().total_bytes == 2 * N_6_7B
    assert plan.estimate.model_states() == model_states(N_6_7B, "mixed", "adam", 3, 8)
    assert plan.fits and "H100 SXM (80 GB): fits" in shown_text(ex)
    want = estimate_transformer(32, 4096, 32, 2048, 1, 50257, precision="mixed",
                                optimizer="adam", device_type="cuda", zero_stage=3,
                                world_size=8)
    assert plan.estimate == want
    activations = plan.estimate.napkin.activations
    ex.widgets["checkpointing"].value = True
    assert ex.result.estimate.checkpointing
    assert ex.result.estimate.napkin.activations < activations / 4  # one input per Block


@pytest.mark.parametrize("precision, per_param", [("fp32", 16), ("bf16", 8), ("mixed", 16)])
def test_memory_recipes_by_hand(precision, per_param):
    # Adam: fp32 4 + 4 + 8; pure bf16 2 + 2 + 4; mixed 2 + 2 + (4 master + 8 moments).
    plan = memory_explorer(interactive=False, model="GPT-2 small (124M)",
                           precision=precision).result
    n = plan.estimate.n_params
    assert n == transformer_params(12, 768, 50257, 1024)
    assert plan.estimate.model_states().total_bytes == per_param * n
    assert plan.fits


# --- what they share: controls, the static fallback, the display -------------------------------

@pytest.mark.parametrize("make", EXPLORERS)
def test_static_fallback_is_text_and_a_picture_and_no_widget(make):
    bundle = make(interactive=False)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "image/png"}
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_MAGIC)


@pytest.mark.parametrize("make", EXPLORERS)
def test_static_fallback_names_every_control_in_its_text_and_under_its_picture(make):
    ex = make(interactive=False)
    line = ex.controls_line()
    assert all(control.label in line for control in ex.controls.values())
    assert ex._repr_mimebundle_()["text/plain"].splitlines()[-1] == line
    assert [t.get_text() for t in ex.static_figure().texts][-1] == line
    assert line not in ex.text()  # the live view shows the controls themselves


@pytest.mark.parametrize("make", EXPLORERS)
def test_every_label_fits_beside_its_control(make):
    """An explorer's labels share one column, as wide as its longest label (in `ch`, the width
    of a digit, which a proportional font's letters mostly undercut): none is cut short."""
    ex = make(interactive=True)
    widths = {w.style.description_width for w in ex.widgets.values()}
    assert len(widths) == 1, widths  # the controls line up
    (width,) = widths
    assert width.endswith("ch")
    assert all(int(width[:-2]) >= len(w.description) + 1 for w in ex.widgets.values())


def test_waves_slider_label_is_whole():
    slider = waves_explorer(interactive=True).widgets["blocks_per_sm"]
    assert slider.description == "resident blocks per SM"
    assert int(slider.style.description_width[:-2]) > len(slider.description)


@pytest.mark.parametrize("make", EXPLORERS)
def test_interactive_bundle_keeps_the_static_text_that_nbval_compares(make):
    # nbval skips widget views (random model ids) and pictures; the text it does compare must
    # be the same whether or not the widgets are shown, on every run.
    static = make(interactive=False)._repr_mimebundle_()
    ex = make(interactive=True)
    live = ex._repr_mimebundle_()
    fallback = f"{ex.text()}\n{ex.controls_line()}"
    assert live["text/plain"] == static["text/plain"] == fallback
    assert live[WIDGET_VIEW]["model_id"] == ex.widget().model_id
    assert ex.widget() is ex.widget()  # built once, whatever displays it


def test_without_a_kernel_or_ipywidgets_the_explorer_is_static(monkeypatch):
    assert not widgets_available()  # pytest runs no IPython kernel
    assert not roofline_explorer().interactive
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if it were not installed
    assert not widgets_available()
    assert "image/png" in waves_explorer()._repr_mimebundle_()
    with pytest.raises(ImportError, match="pip install ipywidgets"):
        waves_explorer(interactive=True)


def test_controls_refuse_unknown_names_and_values():
    ex = pipeline_explorer(interactive=False)
    with pytest.raises(ValueError, match="no control 'p'.*pp_size"):
        ex.set(p=4)
    with pytest.raises(ValueError, match="from 1 to 32"):
        ex.set(n_microbatches=64)
    with pytest.raises(ValueError, match="'GPipe', '1F1B'"):
        ex.set(schedule="zero bubble")
    with pytest.raises(ValueError, match="True or False"):
        memory_explorer(interactive=False, checkpointing="yes")
    assert ex.values["n_microbatches"] == 8  # a refused set changes nothing


def test_importing_the_explorers_loads_no_matplotlib_or_ipywidgets():
    code = ("import sys, gpulab.explorers as e; e.roofline_explorer; e.memory_explorer; "
            "bad = {'matplotlib', 'ipywidgets'} & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
