"""`python -m gpulab doctor`: what this machine can do for the course, and what to do next.

Every probe is allowed to fail: a missing package or driver becomes a line of advice, never a
traceback, because the learner reading this report is usually the one whose setup is broken.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field

import gpulab


@dataclass
class Report:
    """Sections of (label, value) lines, and advice for anything missing."""

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    problems: int = 0  # advice lines that mean the course cannot run as it is

    def problem(self, text: str) -> None:
        self.problems += 1
        self.advice.append(text)

    def add(self, section: str, label: str, value) -> None:
        self.sections.setdefault(section, []).append((label, str(value)))

    def render(self) -> str:
        width = max((len(k) for rows in self.sections.values() for k, _ in rows), default=10)
        out = ["gpulab doctor", "============="]
        for title, rows in self.sections.items():
            out += ["", title]
            out += [f"  {label.ljust(width)}  {value}" for label, value in rows]
        out += ["", "Next steps"]
        out += [f"  - {a}" for a in self.advice] or ["  - Nothing missing: open lessons/."]
        return "\n".join(out)


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, "__version__", "installed")


def _software(report: Report) -> None:
    report.add("Software", "python", f"{platform.python_version()} ({sys.executable})")
    report.add("Software", "gpulab", gpulab.__version__)
    for name in ("torch", "numba", "numpy", "nbgrader", "jupyterlab"):
        version = _version(name)
        report.add("Software", name, version or "not installed")
        if version is None:
            report.problem(f"{name} is missing: run `make lab` (or `pip install -e .[course]`).")


def _torch(report: Report) -> None:
    try:
        import torch
    except Exception:
        return
    report.add("Software", "torch CUDA build", torch.version.cuda or "none (CPU build)")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            report.add("GPUs", f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.1f} GiB, "
                       f"compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs")
    elif gpulab.runner.gpu_count:
        report.problem("The CUDA driver sees a GPU but torch cannot use it: this torch is "
                             "a CPU build. Remove .venv and run `make lab` on this machine.")


def _nvml(report: Report) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        report.add("GPUs", "NVML", "not available (no NVIDIA driver)")
        return
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        report.add("GPUs", "NVIDIA driver", driver)
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            report.add("GPUs", f"nvml:{i}", f"{mem.used / 2**30:.1f} / {mem.total / 2**30:.1f} "
                       f"GiB used, {util.gpu}% busy")
    finally:
        pynvml.nvmlShutdown()


def _runner(report: Report) -> None:
    runner = gpulab.runner
    report.add("Runner", "runner", f"{runner.name} (GPULAB_RUNNER={runner.requested})")
    sim = "on: kernels run on Numba's CUDA simulator" if runner.simulator else "off: real GPU"
    report.add("Runner", "numba simulator", sim)
    report.add("Runner", "NVIDIA GPUs", runner.gpu_count)
    report.add("Runner", "Colab", "yes" if runner.in_colab else "no")
    try:
        report.add("Runner", "torch device", runner.device_kind)
        report.add("Runner", "collective backend", runner.backend)
        recipe = runner.autocast
        scaler = " + GradScaler" if recipe.use_grad_scaler else ""
        report.add("Runner", "mixed precision", f"{recipe.dtype_name} autocast{scaler}")
    except Exception as e:  # torch missing or broken: the software section already says so
        report.add("Runner", "torch device", f"unknown ({e.__class__.__name__}: {e})")
    if runner.name == "cpu":
        report.advice.append(
            "No NVIDIA GPU: the course runs on the cpu runner (simulated kernels, gloo, bf16). "
            "Everything works; for real GPU timings use Colab with a GPU runtime.")


def _backends(report: Report) -> None:
    try:
        import torch.distributed as dist
    except Exception:
        return
    names = [n for n, ok in (("gloo", dist.is_gloo_available()),
                             ("nccl", dist.is_nccl_available()),
                             ("mpi", dist.is_mpi_available())) if ok]
    report.add("Runner", "available backends", ", ".join(names) or "none")


def report() -> tuple[str, bool]:
    """The doctor's text and whether everything the course needs is present."""
    r = Report()
    _software(r)
    _torch(r)
    _nvml(r)
    _runner(r)
    _backends(r)
    return r.render(), r.problems == 0
