"""Watch the machine while code runs: GPU utilization, memory, power and temperature through
NVML (the library behind nvidia-smi, via nvidia-ml-py), or, where there is no NVIDIA driver,
this process's CPU use and memory (psutil), with a note that says so.

    with Monitor(interval_s=0.5) as mon:    # samples in a background thread
        mon.show()                          # a live view in the notebook (ipywidgets)
        train(model, loader, optimizer, steps=200)
    mon.plot()                              # utilization and memory over time (a Figure)
    print(mon.summary())                    # mean and peak utilization, peak memory

NVML's "utilization" is the fraction of the last sample period in which at least one kernel was
running on the GPU: 100% means never idle, not every SM busy. NVML numbers GPUs as nvidia-smi
does, whatever CUDA_VISIBLE_DEVICES says. On the CPU, "this process" leaves out DataLoader
worker processes: their work shows as the main process waiting less, not as its CPU use.
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, fields

from gpulab.env import nvidia_gpu_count

NVML_ABSENT_NOTE = ("NVML is absent: no NVIDIA driver here; showing this process's CPU and "
                    "memory")
THREAD_NAME = "gpulab-monitor"
MIB = 2**20
SPARKS = "▁▂▃▄▅▆▇█"  # one character per sample in the live view's utilization trace


@dataclass(frozen=True)
class Sample:
    """One reading of one device."""

    time_s: float  # seconds since the monitor was created
    device: str  # "gpu0", "gpu1", ... (NVML index) or "cpu"
    # GPU: % of the last period in which a kernel ran (None where NVML cannot tell: a MIG
    # slice). cpu: this process's CPU use, in % of all usable cores.
    utilization_pct: float | None
    memory_used_mib: float  # GPU: device memory in use, every process; cpu: this process's RSS
    memory_total_mib: float  # GPU: device memory; cpu: the machine's RAM
    power_w: float | None = None  # GPU board power draw; None on the CPU or when unsupported
    temperature_c: float | None = None  # GPU core temperature; None on the CPU
    system_memory_used_mib: float | None = None  # cpu: RAM in use by every process; GPU: None


class _NvmlSource:
    """Readings of NVIDIA GPUs through NVML."""

    kind = "nvml"

    def __init__(self, devices=None):
        import pynvml  # imported here: a test puts a fake module in its place

        self.nvml = pynvml
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.indices = list(range(count)) if devices is None else list(devices)
            if not self.indices:
                raise RuntimeError("NVML started but reports no GPU")
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
            self.names = {f"gpu{i}": _text(pynvml.nvmlDeviceGetName(h))
                          for i, h in zip(self.indices, self.handles, strict=True)}
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def _optional(self, read):
        """A reading some GPUs do not support (power on some boards, utilization on a MIG
        slice), or None."""
        try:
            return read()
        except getattr(self.nvml, "NVMLError", Exception):
            return None

    def read(self, time_s: float) -> list[Sample]:
        nvml, samples = self.nvml, []
        for i, h in zip(self.indices, self.handles, strict=True):
            memory = nvml.nvmlDeviceGetMemoryInfo(h)
            power_mw = self._optional(lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))
            samples.append(Sample(
                time_s=time_s, device=f"gpu{i}",
                utilization_pct=self._optional(
                    lambda h=h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
                memory_used_mib=memory.used / MIB, memory_total_mib=memory.total / MIB,
                power_w=None if power_mw is None else power_mw / 1000,
                temperature_c=self._optional(
                    lambda h=h: float(nvml.nvmlDeviceGetTemperature(h,
                                                                    nvml.NVML_TEMPERATURE_GPU)))))
        return samples

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class _PsutilSource:
    """Readings of this process on the CPU, for machines without NVML."""

    kind = "psutil"

    def __init__(self):
        import psutil

        self.psutil = psutil
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call starts the measurement and returns 0
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.names = {"cpu": f"this process (pid {self.process.pid}), {self.cores} cores"}

    def read(self, time_s: float) -> list[Sample]:
        ram = self.psutil.virtual_memory()
        # cpu_percent counts 100 per busy core: divide so that 100 means every usable core.
        return [Sample(time_s=time_s, device="cpu",
                       utilization_pct=min(self.process.cpu_percent(None) / self.cores, 100.0),
                       memory_used_mib=self.process.memory_info().rss / MIB,
                       memory_total_mib=ram.total / MIB,
                       system_memory_used_mib=(ram.total - ram.available) / MIB)]

    def close(self) -> None:
        pass


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)  # old pynvml returns bytes


def _open_source(source: str, devices):
    """(reader, note): NVML when it starts, else psutil with a note saying why."""
    if source not in ("auto", "nvml", "psutil"):
        raise ValueError(f"source must be 'auto', 'nvml' or 'psutil', got {source!r}")
    if source == "psutil":
        return _PsutilSource(), "showing this process's CPU and memory (source='psutil')"
    try:
        return _NvmlSource(devices), ""
    except Exception as err:
        if source == "nvml":
            raise RuntimeError(f"NVML could not start: {type(err).__name__}: {err}") from err
        if nvidia_gpu_count() > 0:  # a GPU is here, yet NVML failed: say so, loudly
            note = (f"NVML failed on this GPU machine ({type(err).__name__}: {err}); showing "
                    "this process's CPU and memory instead. Check that `nvidia-smi` works (a "
                    "driver and library version mismatch is the usual cause) and that "
                    "nvidia-ml-py is installed.")
        else:
            note = NVML_ABSENT_NOTE
        return _PsutilSource(), note


class Monitor:
    """Samples every `interval_s` seconds in a background thread, from start() to stop() (or
    around a `with` block). Keeps the last `max_samples` samples.

    source: "auto" (NVML if it starts, else psutil with a note), "nvml" (raise if it cannot
    start) or "psutil". devices: NVML indices to watch (default: every GPU)."""

    def __init__(self, interval_s: float = 0.5, source: str = "auto", devices=None,
                 max_samples: int = 100_000):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._reader, self.note = _open_source(source, devices)
        self.source = self._reader.kind  # "nvml" or "psutil"
        self.devices = dict(self._reader.names)  # "gpu0" -> "NVIDIA H100 80GB HBM3", ...
        self._samples = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._closed = False
        self._view = None
        self.error = None  # what stopped the sampling thread, if a reading failed
        self._t0 = time.perf_counter()

    # --- sampling -----------------------------------------------------------------------------

    def sample_now(self) -> list[Sample]:
        """Take one reading of every device now, keep it, and return it."""
        if self._closed:
            raise RuntimeError("this Monitor is stopped; create a new one")
        samples = self._reader.read(time.perf_counter() - self._t0)
        with self._lock:
            self._samples.extend(samples)
        if self._view is not None:
            self._view.update()
        return samples

    def _run(self) -> None:
        while True:
            try:
                self.sample_now()
            except Exception as err:  # keep the error for the user; a dead thread says nothing
                self.error = err
                return
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> Monitor:
        """Start sampling in a background (daemon) thread; returns self."""
        if self._closed:
            raise RuntimeError("a Monitor runs once: create a new one to monitor again")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, wait for it to end, and release NVML. Safe to call twice."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, 4 * self.interval_s))
            if self._thread.is_alive():
                raise RuntimeError("the monitor's thread did not stop: a reading is hanging")
        self._closed = True
        self._reader.close()
        if self._view is not None:
            self._view.update(final=True)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- reading the samples ------------------------------------------------------------------

    @property
    def samples(self) -> list[Sample]:
        """Every kept sample, oldest first (all devices interleaved)."""
        with self._lock:
            return list(self._samples)

    def series(self, device: str | None = None) -> dict:
        """One device's samples as NumPy arrays, one per Sample field (None becomes NaN), for
        plotting. device: "gpu0", "cpu", ...; default the first one."""
        import numpy as np

        device = device or next(iter(self.devices))
        if device not in self.devices:
            raise KeyError(f"no device {device!r}; this monitor watches {list(self.devices)}")
        mine = [s for s in self.samples if s.device == device]
        return {f.name: np.array([np.nan if getattr(s, f.name) is None else getattr(s, f.name)
                                  for s in mine], dtype=float)
                for f in fields(Sample) if f.name != "device"}

    def summary(self) -> str:
        """Per device: samples, mean and peak utilization, peak memory; then the note."""
        import numpy as np

        lines = []
        for device, name in self.devices.items():
            s = self.series(device)
            if not len(s["time_s"]):
                lines.append(f"{device} ({name}): no samples")
                continue
            what = "GPU" if self.source == "nvml" else "CPU (this process)"
            util = s["utilization_pct"]
            util = (f"mean {np.nanmean(util):.0f}%, peak {np.nanmax(util):.0f}%"
                    if (util == util).any() else "not reported")  # NaN != NaN
            lines.append(f"{device} ({name}): {len(s['time_s'])} samples over "
                         f"{s['time_s'][-1] - s['time_s'][0]:.1f} s; {what} utilization {util}; "
                         f"memory peak {s['memory_used_mib'].max():.0f} of "
                         f"{s['memory_total_mib'][-1]:.0f} MiB")
        if self.note:
            lines.append(f"note: {self.note}")
        if self.error is not None:
            lines.append(f"sampling stopped early: {type(self.error).__name__}: {self.error}")
        return "\n".join(lines)

    # --- pictures -----------------------------------------------------------------------------

    def widget(self):
        """The live view (an ipywidgets VBox): one row per device, updated at every sample."""
        if self._view is None:
            self._view = _LiveView(self)
            self._view.update()
        return self._view.box

    def show(self):
        """Display the live view in the notebook (returns nothing, so it shows once)."""
        from IPython.display import display

        display(self.widget())

    def plot(self, title: str | None = None):
        """Utilization and memory over time, one line per device (a matplotlib Figure)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(8, 4.5), dpi=90)
        util_ax, mem_ax = fig.subplots(2, 1, sharex=True)
        for device in self.devices:
            s = self.series(device)
            util_ax.plot(s["time_s"], s["utilization_pct"], label=device)
            (line,) = mem_ax.plot(s["time_s"], s["memory_used_mib"], label=f"{device} used")
            if len(s["time_s"]) and self.source == "nvml":  # (the RAM total would dwarf an RSS)
                mem_ax.axhline(s["memory_total_mib"][-1], ls="--", lw=1, color=line.get_color(),
                               label=f"{device} total")
        util_ax.set_ylabel("GPU util %" if self.source == "nvml" else "process CPU %")
        util_ax.set_ylim(0, 105)
        mem_ax.set_ylabel("GPU memory, MiB" if self.source == "nvml" else "process RSS, MiB")
        mem_ax.set_xlabel("seconds")
        mem_ax.legend(loc="upper left", fontsize="small")
        fig.suptitle(title or (self.note if self.note else "GPU utilization and memory (NVML)"),
                     fontsize="medium", wrap=True)
        fig.tight_layout()
        return fig


class _LiveView:
    """ipywidgets rows that the sampling thread refreshes (comm messages may be sent from any
    thread, so the view updates while the cell that trains is still running)."""

    def __init__(self, monitor: Monitor):
        import ipywidgets as w

        self.monitor = monitor
        header = ("NVML: GPU utilization and memory" if monitor.source == "nvml"
                  else "psutil: this process's CPU and memory")
        note = (f"<div style='background:#fff3cd;padding:4px'><b>Note:</b> {monitor.note}</div>"
                if monitor.note else "")
        self.status = w.HTML(f"<b>{header}</b>, every {monitor.interval_s:g} s{note}")
        self.rows, children = {}, [self.status]
        for device, name in monitor.devices.items():
            util = w.FloatProgress(min=0, max=100, description="util %")
            memory = w.FloatProgress(min=0, max=1, description="memory")
            text = w.HTML()
            self.rows[device] = (util, memory, text)
            children += [w.HTML(f"<b>{device}</b>: {name}"), w.HBox([util, memory]), text]
        self.box = w.VBox(children)

    def update(self, final: bool = False) -> None:
        for device, (util, memory, text) in self.rows.items():
            mine = [s for s in self.monitor.samples if s.device == device]
            if not mine:
                text.value = "waiting for the first sample"
                continue
            last = mine[-1]
            util.value = last.utilization_pct or 0.0
            memory.max = max(last.memory_total_mib, 1.0)
            memory.value = last.memory_used_mib
            recent = [s.utilization_pct for s in mine[-40:] if s.utilization_pct is not None]
            spark = "".join(SPARKS[min(int(u / 100 * len(SPARKS)), len(SPARKS) - 1)]
                            for u in recent)
            busy = ("util n/a" if last.utilization_pct is None
                    else f"{last.utilization_pct:.0f}%")
            extras = "".join(f" · {v}" for v in (
                None if last.power_w is None else f"{last.power_w:.0f} W",
                None if last.temperature_c is None else f"{last.temperature_c:.0f} °C") if v)
            text.value = (f"{busy} · {last.memory_used_mib:,.0f} / "
                          f"{last.memory_total_mib:,.0f} MiB (peak "
                          f"{max(s.memory_used_mib for s in mine):,.0f}){extras} · "
                          f"<span style='font-family:monospace'>{spark}</span>"
                          f"{' · stopped' if final else ''}")
