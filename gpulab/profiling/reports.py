"""Read the reports of NVIDIA's profilers as plain records: Nsight Systems' summary tables and
Nsight Compute's per-kernel metrics.

    from gpulab.profiling.reports import example_report, read_ncu_report, read_nsys_kernel_summary
    rows = read_nsys_kernel_summary(example_report("nsys_cuda_gpu_kern_sum.csv"))
    rows[0].name, rows[0].time_pct, rows[0].total_ns, rows[0].instances, rows[0].avg_ns
    kernels = read_ncu_report(example_report("ncu_details.csv"))
    kernels[0].duration_ns, kernels[0].sm_throughput_pct, kernels[0].bottleneck

The example reports shipped in gpulab/profiling/example_reports/ are CONSTRUCTED: the tools'
output formats, with numbers from the course's roofline model of an H100 (see the README there).
The readers take those files and the real output of the same commands, on a GPU machine:

    nsys profile -t cuda,nvtx,osrt -o step python train.py
    nsys stats --report cuda_gpu_kern_sum --format csv --output step step.nsys-rep
    nsys stats --report cuda_api_sum --format csv --output step step.nsys-rep
    ncu --section SpeedOfLight --section LaunchStats --section Occupancy -o kernels python train.py
    ncu --import kernels.ncu-rep --csv --page details --print-units base > kernels.csv

Each reader takes a path or the text itself, and skips whatever comes before the table (nsys's
"Processing ..." lines, ncu's "==PROF==" lines, comment lines).
Taught in: lessons/08_profiling_and_optimization.ipynb
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

# Time units the tools print, in nanoseconds (nsys --timeunit; ncu auto-scaled or base units).
NS_PER = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
          "s": 1e9, "sec": 1e9, "second": 1e9}
# Below this fraction of peak on both compute and memory, Nsight Compute's own rule of thumb
# (its SOLBottleneck rule) points to latency rather than to either roof.
LATENCY_PCT = 60.0


@dataclass(frozen=True)
class NsysRow:
    """One row of an `nsys stats` summary: a kernel (cuda_gpu_kern_sum) or an API call
    (cuda_api_sum), over the whole recording. Times in nanoseconds."""

    name: str
    time_pct: float  # share of the table's total time
    total_ns: float
    instances: int  # launches of the kernel ("Instances") or calls of the API ("Num Calls")
    avg_ns: float | None = None
    med_ns: float | None = None
    min_ns: float | None = None
    max_ns: float | None = None
    stddev_ns: float | None = None


@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel launch from `ncu --csv --page details`. Throughputs are percentages
    of the GPU's peak ("speed of light"); None where the report lacks the metric."""

    id: int  # the launch's number in the report
    name: str
    block_size: str  # "(128, 1, 1)"
    grid_size: str  # "(49152, 1, 1)"
    duration_ns: float | None
    sm_throughput_pct: float | None  # "Compute (SM) Throughput": the busiest compute unit
    memory_throughput_pct: float | None  # "Memory Throughput": the busiest of DRAM, L1, L2
    dram_throughput_pct: float | None  # "DRAM Throughput": device memory alone
    achieved_occupancy_pct: float | None  # active warps per SM over the SM's maximum
    theoretical_occupancy_pct: float | None  # the most the launch configuration allows
    registers_per_thread: float | None
    waves_per_sm: float | None  # grid size over the blocks all SMs hold at once
    metrics: dict = field(default_factory=dict, repr=False)  # (section, metric) -> (value, unit)
    advice: tuple[str, ...] = ()  # the text of Nsight Compute's rules that fired

    @property
    def bottleneck(self) -> str:
        """"compute" or "memory": the roof this kernel runs closest to; "latency" when it is
        below LATENCY_PCT of both (too little parallel work to fill the GPU, or stalls)."""
        sm = self.sm_throughput_pct or 0.0
        memory = self.memory_throughput_pct or self.dram_throughput_pct or 0.0
        if max(sm, memory) < LATENCY_PCT:
            return "latency"
        return "compute" if sm >= memory else "memory"


# --- finding the table -------------------------------------------------------------------------

def _text(source) -> str:
    """The report's text: `source` is the text itself, a path, or an importlib.resources file."""
    if isinstance(source, str) and "\n" in source:
        return source
    if hasattr(source, "read_text"):
        return source.read_text(encoding="utf-8")
    return Path(source).read_text(encoding="utf-8")


def _table(text: str, required: tuple[str, ...], what: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the first CSV table whose header holds every name in `required`; the
    table ends at a blank line or a line that is not a row (the next report's banner)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if all(name in line for name in required)),
                 None)
    if start is None:
        raise ValueError(f"no {what} table found: expected a CSV header with the columns "
                         f"{', '.join(required)}")
    header = [h.strip() for h in next(csv.reader([lines[start]]))]
    rows = []
    for row in csv.reader(io.StringIO("\n".join(lines[start + 1:]))):
        if not row or not any(cell.strip() for cell in row) or row[0].lstrip().startswith(
                ("**", "Processing", "==", "#", "SKIPPED")):
            break
        rows.append([cell.strip() for cell in row])
    return header, rows


def _number(cell: str | None) -> float | None:
    """'1,234.5' -> 1234.5; '', 'n/a' and text -> None (the tools print thousands separators)."""
    if cell is None:
        return None
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


# --- Nsight Systems -------------------------------------------------------------------------------

def _column(header: list[str], *names: str) -> int | None:
    """Index of the first column whose name, without a trailing "(unit)", is one of `names`:
    "Time (%)" and the old "Time(%)" are both "Time"."""
    bare = [re.sub(r"\s*\([^)]*\)$", "", h).strip() for h in header]
    for name in names:
        if name in bare:
            return bare.index(name)
    return None


def _unit_scale(header: list[str], index: int | None) -> float:
    """Nanoseconds per unit of a time column: "Total Time (us)" -> 1000. Old versions name
    no unit ("Average"): nanoseconds."""
    if index is None:
        return 1.0
    found = re.search(r"\((\w+)\)$", header[index])
    return NS_PER.get(found.group(1), 1.0) if found else 1.0


def _read_nsys(source, count_names: tuple[str, ...], what: str) -> list[NsysRow]:
    text = _text(source)
    count_name = next((name for name in count_names if name in text), count_names[0])
    header, rows = _table(text, ("Total Time", count_name, "Name"), what)
    col = {key: _column(header, *names) for key, names in {
        "pct": ("Time",), "total": ("Total Time",), "count": count_names,
        "avg": ("Avg", "Average"), "med": ("Med", "Median"), "min": ("Min", "Minimum"),
        "max": ("Max", "Maximum"), "std": ("StdDev",), "name": ("Name",)}.items()}
    scale = _unit_scale(header, col["total"])

    def cell(row, key):
        i = col[key]
        return row[i] if i is not None and i < len(row) else None

    def ns(row, key):
        value = _number(cell(row, key))
        return None if value is None else value * scale

    return [NsysRow(name=cell(row, "name") or "", time_pct=_number(cell(row, "pct")) or 0.0,
                    total_ns=ns(row, "total") or 0.0,
                    instances=int(_number(cell(row, "count")) or 0), avg_ns=ns(row, "avg"),
                    med_ns=ns(row, "med"), min_ns=ns(row, "min"), max_ns=ns(row, "max"),
                    stddev_ns=ns(row, "std"))
            for row in rows]


def read_nsys_kernel_summary(source) -> list[NsysRow]:
    """The rows of `nsys stats --report cuda_gpu_kern_sum --format csv` (older versions:
    gpukernsum), one per kernel name, in the file's order (most time first)."""
    return _read_nsys(source, ("Instances",), "nsys kernel summary (cuda_gpu_kern_sum)")


def read_nsys_api_summary(source) -> list[NsysRow]:
    """The rows of `nsys stats --report cuda_api_sum --format csv`, one per CUDA API function
    (cudaLaunchKernel, cudaStreamSynchronize, ...); `instances` holds its number of calls."""
    return _read_nsys(source, ("Num Calls", "Calls"), "nsys CUDA API summary (cuda_api_sum)")


# --- Nsight Compute -------------------------------------------------------------------------------

# Field -> the metric's name on the details page, then its raw name (from --metrics).
NCU_FIELDS = {
    "duration_ns": ("Duration", "gpu__time_duration.sum"),
    "sm_throughput_pct": ("Compute (SM) Throughput",
                          "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    "memory_throughput_pct": ("Memory Throughput",
                              "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    "dram_throughput_pct": ("DRAM Throughput",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "achieved_occupancy_pct": ("Achieved Occupancy",
                               "sm__warps_active.avg.pct_of_peak_sustained_active"),
    "theoretical_occupancy_pct": ("Theoretical Occupancy",
                                  "sm__maximum_warps_per_active_cycle_pct"),
    "registers_per_thread": ("Registers Per Thread", "launch__registers_per_thread"),
    "waves_per_sm": ("Waves Per SM", "launch__waves_per_multiprocessor"),
}


def _field_value(metrics: dict, names: tuple[str, ...], as_pct: bool, as_ns: bool):
    for (_, metric), (value, unit) in metrics.items():
        if metric not in names or value is None:
            continue
        if as_pct and unit not in ("%", ""):  # "Memory Throughput" is also a byte/s rate
            continue
        if as_ns:
            if unit and unit not in NS_PER:
                continue
            return value * NS_PER.get(unit, 1.0)
        return value
    return None


def read_ncu_report(source) -> list[NcuKernel]:
    """One NcuKernel per launch in `ncu --csv --page details` output (any sections; the
    SpeedOfLight, LaunchStats and Occupancy sections fill the named fields), in launch order.
    Raw metrics from `--metrics gpu__time_duration.sum,...` on the same page fill them too."""
    header, rows = _table(_text(source), ("Kernel Name", "Metric Name", "Metric Value"),
                          "ncu details (ncu --csv --page details)")
    index = {name: i for i, name in enumerate(header)}

    def cell(row, name):
        i = index.get(name)
        return row[i] if i is not None and i < len(row) else ""

    launches: dict[str, dict] = {}
    for row in rows:
        launch = launches.setdefault(cell(row, "ID"), {"row": row, "metrics": {}, "advice": []})
        metric = cell(row, "Metric Name")
        if metric:
            value = _number(cell(row, "Metric Value"))
            launch["metrics"][(cell(row, "Section Name"), metric)] = (
                value if value is not None else cell(row, "Metric Value") or None,
                cell(row, "Metric Unit"))
        elif cell(row, "Rule Description"):
            launch["advice"].append(cell(row, "Rule Description"))
    kernels = []
    for launch_id, launch in launches.items():
        row, metrics = launch["row"], launch["metrics"]
        numeric = {k: v for k, v in metrics.items() if isinstance(v[0], float)}
        values = {name: _field_value(numeric, names, name.endswith("_pct"),
                                     name == "duration_ns")
                  for name, names in NCU_FIELDS.items()}
        kernels.append(NcuKernel(
            id=int(_number(launch_id) or 0), name=cell(row, "Kernel Name"),
            block_size=cell(row, "Block Size"), grid_size=cell(row, "Grid Size"),
            metrics=metrics, advice=tuple(launch["advice"]), **values))
    return kernels


# --- the shipped examples -------------------------------------------------------------------------

EXAMPLES = "example_reports"


def example_reports() -> list[str]:
    """Names of the example reports shipped with gpulab (see their README.md)."""
    folder = resources.files("gpulab.profiling").joinpath(EXAMPLES)
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".csv"))


def example_report(name: str):
    """The shipped example report `name` (a path-like you can pass to the readers or open).
    They are constructed examples in the tools' formats, not measurements."""
    report = resources.files("gpulab.profiling").joinpath(EXAMPLES, name)
    if not report.is_file():
        raise FileNotFoundError(f"no example report {name!r}; there are: "
                                f"{', '.join(example_reports())}")
    return report
