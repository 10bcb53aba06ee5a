"""gpulab.monitor: samples through NVML (a fake pynvml here: this machine has no GPU) or psutil,
falls back with a note that says why, shows a live widget, and never leaves its thread behind."""

import sys
import threading
import time
import types

import pytest
from matplotlib.figure import Figure

from gpulab import monitor as monitor_module
from gpulab.monitor import NVML_ABSENT_NOTE, THREAD_NAME, Monitor, Sample

MIB = 2**20


class NVMLError(Exception):
    pass


def fake_pynvml(n_gpus=2, init_error=None, power_supported=(True, False)):
    """A stand-in for nvidia-ml-py with `n_gpus` GPUs; counts init and shutdown calls."""
    nvml = types.ModuleType("pynvml")
    nvml.calls = {"init": 0, "shutdown": 0, "reads": 0}  # reads: counted by a test's own reader
    nvml.NVMLError = NVMLError
    nvml.NVML_TEMPERATURE_GPU = 0

    def init():
        if init_error is not None:
            raise init_error
        nvml.calls["init"] += 1

    def utilization(handle):
        return types.SimpleNamespace(gpu=40 + 10 * handle, memory=5)

    def power(handle):
        if not power_supported[handle]:
            raise NVMLError("Not Supported")
        return 250_000 + handle  # milliwatts

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.__setitem__("shutdown", nvml.calls["shutdown"] + 1)
    nvml.nvmlDeviceGetCount = lambda: n_gpus
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3" if h == 0 else "NVIDIA A100"
    nvml.nvmlDeviceGetUtilizationRates = utilization
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=(1000 + h) * MIB, total=81559 * MIB, free=0)
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 50 + h
    return nvml


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def wait_for(monitor, n, timeout_s=20.0):
    """Block until the monitor holds `n` samples (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout_s
    while len(monitor.samples) < n:
        assert time.monotonic() < deadline, f"only {len(monitor.samples)} samples"
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert monitor_threads() == [], "a Monitor left its sampling thread running"


def test_nvml_path_samples_every_gpu_and_shuts_nvml_down(monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Monitor(interval_s=0.01) as mon:
        assert mon.source == "nvml" and mon.note == "" and mon.running
        assert mon.devices == {"gpu0": "NVIDIA H100 80GB HBM3", "gpu1": "NVIDIA A100"}
        wait_for(mon, 6)
    assert not mon.running and nvml.calls["shutdown"] == 1 == nvml.calls["init"]
    first = mon.samples[0]
    assert first == Sample(time_s=first.time_s, device="gpu0", utilization_pct=40.0,
                           memory_used_mib=1000.0, memory_total_mib=81559.0, power_w=250.0,
                           temperature_c=50.0)
    gpu1 = mon.series("gpu1")
    assert (gpu1["utilization_pct"] == 50).all() and (gpu1["memory_used_mib"] == 1001).all()
    assert all(v != v for v in gpu1["power_w"])  # unsupported power reads as NaN, not a crash
    assert (mon.series()["time_s"] == sorted(mon.series()["time_s"])).all()
    assert "gpu0 (NVIDIA H100 80GB HBM3)" in mon.summary() and "note" not in mon.summary()
    mon.stop()  # twice is fine
    assert nvml.calls["shutdown"] == 1


def test_a_mig_slice_without_utilization_still_reports_memory(monkeypatch):
    nvml = fake_pynvml(n_gpus=1)

    def not_supported(handle):
        raise NVMLError("Not Supported")

    nvml.nvmlDeviceGetUtilizationRates = not_supported
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    mon = Monitor()
    box = mon.widget()
    (sample,) = mon.sample_now()
    assert sample.utilization_pct is None and sample.memory_used_mib == 1000
    assert "utilization not reported" in mon.summary()
    assert "util n/a" in box.children[-1].value
    mon.stop()


def test_nvml_devices_can_be_chosen(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mon = Monitor(devices=[1])
    assert list(mon.devices) == ["gpu1"]
    assert [s.device for s in mon.sample_now()] == ["gpu1"]
    mon.stop()


def test_without_a_driver_it_falls_back_to_psutil_with_the_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=NVMLError("Driver Not "
                                                                                 "Loaded")))
    monkeypatch.setattr(monitor_module, "nvidia_gpu_count", lambda: 0)
    with Monitor(interval_s=0.01) as mon:
        wait_for(mon, 3)
    assert mon.source == "psutil" and mon.note == NVML_ABSENT_NOTE
    assert list(mon.devices) == ["cpu"]
    s = mon.samples[-1]
    assert s.device == "cpu" and 0 <= s.utilization_pct <= 100
    assert 0 < s.memory_used_mib < s.memory_total_mib and s.power_w is None
    assert 0 < s.system_memory_used_mib <= s.memory_total_mib
    assert NVML_ABSENT_NOTE in mon.summary()


def test_nvml_failing_on_a_gpu_machine_says_so(monkeypatch):
    mismatch = NVMLError("Driver/library version mismatch")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=mismatch))
    monkeypatch.setattr(monitor_module, "nvidia_gpu_count", lambda: 1)
    mon = Monitor()
    assert mon.source == "psutil"
    assert "NVML failed on this GPU machine" in mon.note and "version mismatch" in mon.note
    assert "nvidia-smi" in mon.note
    with pytest.raises(RuntimeError, match="NVML could not start.*mismatch"):
        Monitor(source="nvml")
    mon.stop()


def test_a_machine_without_the_nvml_package_falls_back_too(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setattr(monitor_module, "nvidia_gpu_count", lambda: 0)
    mon = Monitor()
    assert mon.source == "psutil" and mon.note == NVML_ABSENT_NOTE
    mon.stop()


def test_widget_shows_the_note_and_follows_the_samples(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(monitor_module, "nvidia_gpu_count", lambda: 0)
    mon = Monitor(source="auto")
    box = mon.widget()
    assert mon.widget() is box  # one view per monitor
    html = " ".join(getattr(c, "value", "") for c in box.children if hasattr(c, "value"))
    assert "NVML is absent" in html and "waiting for the first sample" in html
    mon.sample_now()
    text = box.children[-1].value
    assert "MiB" in text and "peak" in text
    mon.stop()
    assert "stopped" in box.children[-1].value


def test_nvml_widget_has_a_row_per_gpu_with_power_and_temperature(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mon = Monitor()
    box = mon.widget()
    mon.sample_now()
    status, name0, bars0, text0, name1, bars1, text1 = box.children
    assert "H100" in name0.value and "A100" in name1.value
    assert "250 W" in text0.value and "50 °C" in text0.value
    assert "51 °C" in text1.value and " W" not in text1.value  # gpu1 reports no power
    util, memory = bars0.children
    assert util.value == 40 and memory.value == 1000 and memory.max == 81559
    mon.stop()


def test_plot_has_utilization_and_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mon = Monitor()
    for _ in range(3):
        mon.sample_now()
    mon.stop()
    fig = mon.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert len(fig.axes[0].lines) == 2  # one utilization line per GPU


def test_stop_ends_a_long_interval_at_once_and_a_monitor_runs_once():
    mon = Monitor(interval_s=60, source="psutil").start()
    wait_for(mon, 1)
    mon.stop()  # the thread waits on an Event, so stop does not wait out the 60 s
    assert not mon.running
    with pytest.raises(RuntimeError, match="runs once"):
        mon.start()
    with pytest.raises(RuntimeError, match="stopped"):
        mon.sample_now()


def test_a_failing_reading_stops_the_thread_and_is_reported(monkeypatch):
    nvml = fake_pynvml(n_gpus=1)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    mon = Monitor(interval_s=0.01)

    def broken(handle):
        if nvml.calls["reads"] >= 2:
            raise NVMLError("GPU is lost")
        nvml.calls["reads"] += 1
        return types.SimpleNamespace(used=MIB, total=2 * MIB, free=MIB)

    nvml.nvmlDeviceGetMemoryInfo = broken
    mon.start()
    mon._thread.join(timeout=20)
    assert not mon.running and isinstance(mon.error, NVMLError)
    assert len(mon.samples) == 2 and "GPU is lost" in mon.summary()
    mon.stop()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="source"):
        Monitor(source="nvidia-smi")
    with pytest.raises(ValueError, match="positive"):
        Monitor(interval_s=0)
    mon = Monitor(source="psutil")
    with pytest.raises(KeyError, match="gpu0"):
        mon.series("gpu0")
    mon.stop()
