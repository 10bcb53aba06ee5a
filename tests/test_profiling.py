"""gpulab.profiling: phases add up to the step and find a slow loader, the trace opens, the top
ops carry the profiler's FLOPs, byte estimates follow hardware.py's convention, and each regime
is recognised on a step built to be clearly in it (CPU here; the GPU path on hand-made records).

The regime tests use a fixed, modest roofline so that the decision depends on counted FLOPs and
bytes, not on how fast this shared machine happens to be."""

import gzip
import json
import time

import pytest
import torch
from matplotlib.figure import Figure
from torch.utils.data import DataLoader, Dataset

from gpulab import hardware, models
from gpulab.profiling import (
    OpCall,
    ProfileResult,
    Span,
    labelled_training_step,
    phase,
    profile_steps,
)
from gpulab.profiling import regime as regime_module
from gpulab.profiling.traffic import moves_data, op_bytes, op_dtype

# A very slow machine on purpose: the ops here run faster than this roofline says even when
# other processes crowd the cores, so the "speed of light" stays high and only FLOPs against
# bytes decide compute versus memory. Its ridge point is 25 FLOP/byte.
SLOW_CPU = hardware.MeasuredRoofline("test CPU", "cpu", bandwidth_gbps=0.2, fp32=0.005,
                                     bf16=0.005, measured=False)
# Big enough that a step takes tens of milliseconds: a millisecond lost to another process on
# this shared machine then hardly moves the step's busy fraction.
N = 1024  # matmul size: 2*N**3 FLOPs on 3*N*N*4 bytes, 171 FLOP/byte, ridge 25
ELEMENTS = 8_000_000  # elementwise size: 1 FLOP per 12 bytes


class SlowDigits(Dataset):
    """Each item takes SLEEP_S to load, like a per-sample decode from disk."""

    SLEEP_S = 0.005

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(self.SLEEP_S)
        return torch.full((16,), float(i % 7)), torch.tensor(i % 3)


def mlp_setup(dataset=None, batch_size=8):
    torch.manual_seed(0)
    model = models.MLP(16, 3, hidden=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset or SlowDigits(), batch_size=batch_size)
    return model, loader, optimizer


@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """One intra-op thread: when other processes share the cores, OpenMP threads waiting at a
    barrier for a descheduled sibling make some ops 10x slower, and a test would see that."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def slow_loader_profile(one_cpu_thread):
    model, loader, optimizer = mlp_setup()
    return profile_steps(model, loader, optimizer, steps=3, warmup=1, device="cpu")


def test_phases_add_up_and_show_the_slow_loader(slow_loader_profile):
    phases = slow_loader_profile.phases()
    parts = phases.as_dict()
    assert list(parts) == ["data", "forward", "backward", "optimizer", "other"]
    assert phases.steps == 3
    assert sum(parts.values()) == pytest.approx(phases.step_s, rel=1e-9)
    assert all(parts[name] > 0 for name in ("data", "forward", "backward", "optimizer"))
    # 8 items of 5 ms each: the data phase holds every one of those sleeps...
    assert phases.data_s >= 8 * SlowDigits.SLEEP_S
    # ...and is what a person should look at first.
    assert phases.largest() == "data", str(phases)
    assert sum(phases.shares().values()) == pytest.approx(1.0)
    assert "data" in str(phases)


def test_a_loader_bound_step_is_overhead_bound_because_it_waits_for_data(slow_loader_profile):
    result = slow_loader_profile
    assert result.busy_fraction() < 0.5
    r = result.regime(SLOW_CPU)
    assert r.regime == "overhead", str(r)
    assert "data loading" in r.reason and "num_workers" in r.reason
    assert "On a CPU" in r.reason  # it says what the regimes mean on a CPU


def test_summary_and_picture(slow_loader_profile):
    text = slow_loader_profile.summary(5, roofline=SLOW_CPU)
    lines = text.splitlines()
    assert lines[0].startswith("step ") and "overhead-bound" in text
    # The table holds top_ops(5). Which ops those are is left to timing: the model's aten::addmm
    # and the loader's aten::full, aten::empty and aten::fill_ each take some hundred
    # microseconds, and on a busy machine any one of them can drop out of the five.
    rows = lines[lines.index("top 5 ops over 3 steps:") + 2:][:5]
    assert [row[2:46].rstrip() for row in rows] == [
        op.name[:43] for op in slow_loader_profile.top_ops(5)], text
    assert "aten::addmm" in slow_loader_profile.summary(100, roofline=SLOW_CPU)  # every op
    top_flops = {op.name for op in slow_loader_profile.top_ops(2, by="flops")}
    assert top_flops == {"aten::addmm", "aten::mm"}, "the Linear layers, forward and backward"
    assert "3 steps of" in repr(slow_loader_profile)
    fig = slow_loader_profile.plot_phases()
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 5  # one bar per phase


def test_chrome_trace_is_valid_json_with_the_phases(slow_loader_profile, tmp_path):
    path = slow_loader_profile.export_chrome_trace(tmp_path / "sub" / "trace.json")
    trace = json.loads(path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert any(str(n).startswith("ProfilerStep#") for n in names)
    assert "aten::addmm" in names
    gz = slow_loader_profile.export_chrome_trace(tmp_path / "trace.json.gz")
    with gzip.open(gz, "rt") as f:
        assert json.load(f)["traceEvents"]


def test_top_ops_of_a_matmul_step():
    a = torch.randn(N, N)

    def step():
        with phase("forward"):
            a @ a

    result = profile_steps(step, steps=2, warmup=1, device="cpu")
    top = result.top_ops(5)
    assert top[0].name == "aten::mm", top
    assert top[0].calls == 2 and top[0].flops == 2 * 2 * N**3
    assert top[0].self_s > 0 and top[0].total_s >= top[0].self_s and top[0].device_s == 0
    assert all(op.name not in ("forward", "data") for op in result.top_ops(100))
    assert result.top_ops(1, by="calls")[0].calls >= 2
    with pytest.raises(ValueError, match="OpStat field"):
        result.top_ops(by="seconds")
    r = result.regime(SLOW_CPU)
    assert r.regime == "compute", str(r)
    assert r.flops == 2 * N**3 and r.n_bytes == 3 * N * N * 4
    assert r.intensity == pytest.approx(hardware.gemm_intensity(N, N, N, "fp32"))
    assert r.ridge == pytest.approx(25.0) and r.intensity > r.ridge
    assert r.memory_s == 0 and r.compute_s == pytest.approx(2 * N**3 / 0.005e12)
    assert "above the ridge point" in r.reason


def test_big_elementwise_is_memory_bound():
    x, y = torch.randn(ELEMENTS), torch.randn(ELEMENTS)

    def step():
        with phase("forward"):
            x + y

    r = profile_steps(step, steps=2, warmup=1, device="cpu").regime(SLOW_CPU)
    assert r.regime == "memory", str(r)
    assert r.flops == ELEMENTS and r.n_bytes == 3 * ELEMENTS * 4
    assert r.intensity == pytest.approx(1 / 12) and "below the ridge point" in r.reason


def test_tiny_ops_in_a_python_loop_are_overhead_bound():
    x = torch.ones(8)

    def step():
        with phase("forward"):
            y = x
            for _ in range(300):
                y = y * 1.0001 + 0.5

    r = profile_steps(step, steps=2, warmup=1, device="cpu").regime(SLOW_CPU)
    assert r.regime == "overhead", str(r)
    assert r.ops_per_step == 600
    # Dispatching them costs more than their arithmetic and traffic, even on this slow roofline.
    assert r.overhead_s > r.compute_s + r.memory_s


def test_default_roofline_is_measured_once_on_a_cpu(monkeypatch):
    calls = []

    def fake_measure(device, dtypes=("fp32",)):
        calls.append((device, dtypes))
        return hardware.MeasuredRoofline("this CPU (measured)", "cpu", 2.0, 0.05, 0.05)

    monkeypatch.setattr(regime_module.hardware, "measure_roofline", fake_measure)
    a = torch.randn(128, 128)

    def step():
        with phase("forward"), torch.autocast("cpu", dtype=torch.bfloat16):
            a @ a

    result = profile_steps(step, steps=1, warmup=1, device="cpu")
    first, second = result.regime(), result.regime()
    assert calls == [("cpu", ("bf16", "fp32"))]  # measured once, in the dtypes the step uses
    assert first == second and first.dtype == "bf16"
    assert "measured on this machine" in first.reason


def test_training_step_with_bf16_autocast_profiles_in_bf16():
    model, loader, optimizer = mlp_setup(dataset=torch.utils.data.TensorDataset(
        torch.randn(32, 16), torch.randint(0, 3, (32,))))
    result = profile_steps(model, loader, optimizer, steps=2, warmup=1, device="cpu", amp=True)
    assert result.regime(SLOW_CPU).dtype == "bf16"
    step = labelled_training_step(model, loader, optimizer, device="cpu")
    assert torch.isfinite(step())  # a step function that returns the loss


def test_mistakes_are_refused():
    model, loader, optimizer = mlp_setup()
    with pytest.raises(ValueError, match="one of"):
        with phase("fwd"):
            pass
    with pytest.raises(ValueError, match="loader and optimizer"):
        profile_steps(model, steps=1)
    with pytest.raises(ValueError, match="with a model only"):
        profile_steps(lambda: None, loader, steps=1)
    with pytest.raises(ValueError, match="at least 1"):
        profile_steps(lambda: None, steps=0)


# --- the GPU path, on records made by hand ---------------------------------------------------

def gpu_result(kernels):
    """One 10 ms step on a GPU with a single big matmul in it, and the given kernel spans."""
    matmul = OpCall("aten::mm", 0.0005, 0.0015, self_s=0.001, device_s=0.008, flops=2 * 8192**3,
                    thread=1, outermost=True, work_flops=2 * 8192**3,
                    work_bytes=3 * 8192**2 * 2, dtype="bf16")
    return ProfileResult(device="cuda", steps=[Span("ProfilerStep#2", 0.0, 0.010, 1)],
                         phase_spans=[Span("forward", 0.0005, 0.0095, 1)], ops=[matmul],
                         kernels=[Span("sm90_gemm", a, b) for a, b in kernels])


def test_busy_gpu_running_a_big_matmul_is_compute_bound():
    # Two streams overlap between 1 and 3 ms: busy time counts them once (9.5 ms of 10).
    result = gpu_result([(0.0005, 0.003), (0.001, 0.0095)])
    assert result.busy_fraction() == pytest.approx(0.9)
    r = result.regime("H100 SXM")
    assert r.regime == "compute", str(r)
    assert r.dtype == "bf16" and r.ridge == pytest.approx(
        hardware.ops_per_byte(hardware.get_gpu("H100 SXM"), "bf16"))
    assert "On a CPU" not in r.reason
    assert result.top_ops(1)[0].device_s == 0.008  # sorted by device time on a GPU


def test_idle_gpu_is_overhead_bound_whatever_its_kernels_are():
    r = gpu_result([(0.001, 0.002)]).regime("H100 SXM")  # busy 1 ms of 10
    assert r.regime == "overhead" and r.busy_fraction == pytest.approx(0.1)
    assert "busy only 10%" in r.reason


def test_a_result_needs_steps():
    with pytest.raises(ValueError, match="no profiled steps"):
        ProfileResult(device="cpu", steps=[], phase_spans=[], ops=[])
    with pytest.raises(ValueError, match="no trace"):
        gpu_result([]).export_chrome_trace("never.json")


# --- bytes from shapes --------------------------------------------------------------------------

def test_op_bytes_follow_the_read_once_write_once_convention():
    f = ["float", "float"]
    assert op_bytes("aten::mm", [[64, 256], [256, 512]], f) == 4 * (64 * 256 + 256 * 512
                                                                    + 64 * 512)
    addmm = op_bytes("aten::addmm", [[512], [64, 256], [256, 512], [], []],
                     ["float", "float", "float", "Scalar", "Scalar"])
    assert addmm == 4 * (512 + 64 * 256 + 256 * 512 + 64 * 512)
    linear = op_bytes("aten::linear", [[8, 4, 256], [512, 256], [512]], ["c10::BFloat16"] * 3)
    assert linear == 2 * (8 * 4 * 256 + 512 * 256 + 512 + 8 * 4 * 512)
    assert op_bytes("aten::add", [[1000], [1000], []], ["float", "float", "Scalar"]) == 12000
    assert op_bytes("aten::add_", [[10, 10], [10], []], ["float", "float", "Scalar"]) == 840
    assert op_bytes("aten::copy_", [[100], [100], []], ["float", "c10::Half", "Scalar"]) == 600
    assert op_bytes("aten::zero_", [[100]], ["float"]) == 400
    assert op_bytes("aten::view", [[100], []], ["float", "ScalarList"]) == 0
    assert op_bytes("aten::sum", [[], []], ["Scalar", ""]) == 0  # no tensor: nothing counted


def test_copy_if_needed_ops_move_data_only_when_something_below_copies():
    assert not moves_data("aten::to", [])
    assert moves_data("aten::to", ["aten::_to_copy", "aten::empty_strided", "aten::copy_"])
    assert not moves_data("aten::reshape", ["aten::view"])
    assert not moves_data("aten::t", ["aten::transpose", "aten::as_strided"])
    assert moves_data("aten::mul", [])
    assert op_dtype(["long int", "c10::BFloat16"]) == "bf16" and op_dtype(["long int"]) == "fp32"


def test_busy_time_counts_only_what_falls_inside_the_step():
    from gpulab.profiling.trace import busy_seconds

    step = Span("step", 1.0, 2.0)
    inside, overlapping, after, before = (1.2, 1.4), (1.3, 1.5), (2.5, 3.0), (0.0, 0.5)
    assert busy_seconds([inside, overlapping, after, before], step) == pytest.approx(0.3)
    assert busy_seconds([after], step) == 0.0 and busy_seconds([before], step) == 0.0
    assert busy_seconds([(0.5, 2.5)], step) == pytest.approx(1.0)


def test_dtypes_come_from_kineto_events_where_function_events_lack_them():
    # torch < 2.12: FunctionEvent has no input_dtypes; profiled_events recovers them.
    from torch.profiler import ProfilerActivity, profile

    from gpulab.profiling.trace import profiled_events

    a = torch.randn(32, 32, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        a @ a
    events = prof.events()
    native = hasattr(events[0], "input_dtypes")
    if native:  # make this torch look like an older one
        want = {e.id: list(e.input_dtypes) for e in events}
        for e in events:
            del e.input_dtypes
    assert profiled_events(prof) is events
    got = {e.id: e.input_dtypes for e in events}
    assert any("c10::BFloat16" in dtypes for dtypes in got.values())
    if native:
        assert got == want


def test_records_read_events_of_a_torch_without_the_newer_fields():
    # torch 2.11's FunctionEvent has no activity_type (and older ones no is_user_annotation):
    # phases are still found by their labels, and device copies of them are not kernels.
    from torch.autograd import DeviceType

    from gpulab.profiling.trace import records_from_events

    class Old:
        cpu_parent, cpu_children, input_shapes, flops, thread = None, [], [], 0, 1
        self_cpu_time_total = self_device_time_total = 0

        def __init__(self, name, start_us, end_us, device_type=DeviceType.CPU):
            self.name, self.device_type = name, device_type
            self.time_range = type("Interval", (), {"start": start_us, "end": end_us})()

    events = [Old("ProfilerStep#1", 0, 100), Old("forward", 10, 50),
              Old("forward", 12, 52, DeviceType.CUDA), Old("ampere_sgemm", 20, 40, DeviceType.CUDA)]
    steps, phases, _, kernels = records_from_events(events)
    assert [s.name for s in steps] == ["ProfilerStep#1"]
    assert [p.name for p in phases] == ["forward"]
    assert [k.name for k in kernels] == ["ampere_sgemm"]
