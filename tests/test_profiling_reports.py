"""gpulab.profiling.reports: the nsys and ncu readers, on the shipped examples and on text in the
tools' real output formats (preambles, quoting, thousands separators, units, old headers)."""

import math

import pytest

from gpulab.profiling.reports import (
    NcuKernel,
    example_report,
    example_reports,
    read_ncu_report,
    read_nsys_api_summary,
    read_nsys_kernel_summary,
)

# What `nsys stats --report cuda_gpu_kern_sum --format csv` prints to the terminal: progress
# lines, the table, then the next report.
NSYS_COLUMNS = ('"Time (%)","Total Time (ns)","{count}","Avg (ns)","Med (ns)","Min (ns)",'
                '"Max (ns)","StdDev (ns)","Name"')
NSYS_STDOUT = "\n".join([
    "Generating SQLite file report1.sqlite from report1.nsys-rep",
    "Processing [report1.sqlite] with [/opt/nvidia/nsight-systems/reports/cuda_gpu_kern_sum.py]...",
    "",
    " ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):",
    "",
    NSYS_COLUMNS.format(count="Instances"),
    '"90.0","1,800,000","20","90,000.0","89,500.0","88,000","95,000","1,500.0",'
    '"ampere_sgemm_128x64_tn"',
    '"10.0","200000","40","5000.0","5000.0","4900","5100","50.0",'
    '"void add_kernel<float>(float *, const float *, int)"',
    "",
    "Processing [report1.sqlite] with [/opt/nvidia/nsight-systems/reports/cuda_api_sum.py]...",
    "",
    " ** CUDA API Summary (cuda_api_sum):",
    "",
    NSYS_COLUMNS.format(count="Num Calls"),
    '"70.0","700000","10","70000.0","70000.0","69000","71000","500.0","cudaStreamSynchronize"',
    '"30.0","300000","60","5000.0","5000.0","4000","6000","300.0","cudaLaunchKernel"',
])
# Older Nsight Systems (2021): gpukernsum, no units in the statistics' headers.
NSYS_OLD = """\
Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name
75.5,3000,3,1000.0,900,1100,kernel_a
24.5,973,1,973.0,973,973,kernel_b
"""
NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
              '"Metric Value","Rule Name","Rule Type","Rule Description",'
              '"Estimated Speedup Type","Estimated Speedup"')


def ncu_row(launch, kernel, section, metric, unit, value):
    return (f'"{launch}","4242","python","host","{kernel}","1","7","(256, 1, 1)","(1024, 1, 1)",'
            f'"0","8.0","{section}","{metric}","{unit}","{value}",')


SOL = "GPU Speed Of Light Throughput"
NCU_STDOUT = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.11)",
    '==PROF== Profiling "saxpy" - 0: 0%....50%....100% - 9 passes',
    NCU_HEADER,
    # listed before the SOL section here: its GB/s must not stand in for the SOL percentage
    ncu_row(0, "saxpy", "Memory Workload Analysis", "Memory Throughput", "Gbyte/second",
            "1,810.22"),
    ncu_row(0, "saxpy", SOL, "Memory Throughput", "%", "88.10"),
    ncu_row(0, "saxpy", SOL, "DRAM Throughput", "%", "88.10"),
    ncu_row(0, "saxpy", SOL, "Duration", "usecond", "1,205.50"),
    ncu_row(0, "saxpy", SOL, "Compute (SM) Throughput", "%", "12.30"),
    ncu_row(0, "saxpy", "Occupancy", "Achieved Occupancy", "%", "81.00"),
    ncu_row(0, "saxpy", "Occupancy", "Theoretical Occupancy", "%", "100"),
    ncu_row(0, "saxpy", "Launch Statistics", "Registers Per Thread", "register/thread", "16"),
    ncu_row(0, "saxpy", "Launch Statistics", "Function Cache Configuration", "",
            "CachePreferNone"),
    ('"0","4242","python","host","saxpy","1","7","(256, 1, 1)","(1024, 1, 1)","0","8.0",'
     '"SpeedOfLight","","","","SOLBottleneck","OPT","Memory is more heavily utilized.","",""'),
    ncu_row(1, "tiny", SOL, "Duration", "msecond", "0.0031"),
    ncu_row(1, "tiny", SOL, "Compute (SM) Throughput", "%", "0.50"),
    ncu_row(1, "tiny", SOL, "Memory Throughput", "%", "n/a"),
    ncu_row(1, "tiny", SOL, "DRAM Throughput", "%", "0.40"),
    ncu_row(2, "gemm", "Command line profiler metrics", "gpu__time_duration.sum", "nsecond",
            "52,000"),
    ncu_row(2, "gemm", "Command line profiler metrics",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "81.5"),
    ncu_row(2, "gemm", "Command line profiler metrics",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "35.0"),
    "==PROF== Disconnected from process 4242",
])


# --- the shipped examples ------------------------------------------------------------------------

def test_every_shipped_report_is_small_and_says_it_is_constructed():
    assert example_reports() == ["ncu_details.csv", "nsys_cuda_api_sum.csv",
                                 "nsys_cuda_gpu_kern_sum.csv"]
    for name in example_reports():
        text = example_report(name).read_text()
        assert len(text.encode()) < 20_000, name
        assert text.startswith("# CONSTRUCTED EXAMPLE, NOT A MEASUREMENT."), name
    readme = example_report("README.md").read_text()
    assert "constructed examples, not measurements" in readme


def test_unknown_example_names_the_ones_there_are():
    with pytest.raises(FileNotFoundError, match="nsys_cuda_api_sum.csv"):
        example_report("nsys_gpukernsum.csv")


def _consistent_summary(rows):
    total = sum(r.total_ns for r in rows)
    assert [r.total_ns for r in rows] == sorted((r.total_ns for r in rows), reverse=True)
    for r in rows:
        assert r.time_pct == pytest.approx(100 * r.total_ns / total, abs=0.06), r.name
        assert r.avg_ns == pytest.approx(r.total_ns / r.instances, abs=0.051), r.name
        assert r.min_ns <= r.med_ns <= r.max_ns and r.min_ns <= r.avg_ns <= r.max_ns, r.name
        assert (r.stddev_ns == 0) == (r.min_ns == r.max_ns), r.name


def test_shipped_nsys_summaries_read_and_add_up():
    kernels = read_nsys_kernel_summary(example_report("nsys_cuda_gpu_kern_sum.csv"))
    api = read_nsys_api_summary(example_report("nsys_cuda_api_sum.csv"))
    _consistent_summary(kernels)
    _consistent_summary(api)
    calls = {r.name: r.instances for r in api}
    # Every kernel was launched by one launch call, and the loss came back once per sync.
    assert sum(r.instances for r in kernels) == calls["cudaLaunchKernel"] + calls[
        "cuLaunchKernelEx"]
    assert calls["cudaMemcpyAsync"] == 3 * calls["cudaStreamSynchronize"]
    assert "gemm" in kernels[0].name


def test_shipped_ncu_report_kernels_are_self_consistent_and_agree_with_nsys():
    kernels = read_ncu_report(example_report("ncu_details.csv"))
    nsys = read_nsys_kernel_summary(example_report("nsys_cuda_gpu_kern_sum.csv"))
    assert [k.id for k in kernels] == list(range(len(kernels))) and len(kernels) == 6
    for k in kernels:
        assert k.dram_throughput_pct <= k.memory_throughput_pct <= 100, k.name
        assert 0 < k.sm_throughput_pct <= 100, k.name
        assert k.achieved_occupancy_pct <= k.theoretical_occupancy_pct <= 100, k.name
        blocks = math.prod(int(d) for d in k.grid_size.strip("()").split(","))
        assert k.metrics[("Launch Statistics", "Grid Size")][0] == blocks, k.name
        assert k.advice, k.name
        # the same kernel in the nsys summary: this launch lies within its range of durations
        same = [r for r in nsys if k.name in r.name]
        assert any(r.min_ns <= k.duration_ns <= r.max_ns for r in same), k.name
    assert [k.bottleneck for k in kernels] == [
        "compute", "latency", "memory", "memory", "memory", "latency"]


# --- real formats ----------------------------------------------------------------------------

def test_nsys_terminal_output_skips_progress_lines_and_stops_at_the_next_report():
    kernels = read_nsys_kernel_summary(NSYS_STDOUT)
    assert [r.name for r in kernels] == [
        "ampere_sgemm_128x64_tn", "void add_kernel<float>(float *, const float *, int)"]
    assert kernels[0].total_ns == 1_800_000 and kernels[0].instances == 20
    assert kernels[0].avg_ns == 90_000 and kernels[0].stddev_ns == 1500
    api = read_nsys_api_summary(NSYS_STDOUT)
    assert [(r.name, r.instances) for r in api] == [("cudaStreamSynchronize", 10),
                                                     ("cudaLaunchKernel", 60)]


def test_nsys_old_headers_and_other_time_units(tmp_path):
    old = read_nsys_kernel_summary(NSYS_OLD)
    assert [(r.name, r.time_pct, r.instances, r.avg_ns, r.min_ns, r.med_ns) for r in old] == [
        ("kernel_a", 75.5, 3, 1000.0, 900.0, None), ("kernel_b", 24.5, 1, 973.0, 973.0, None)]
    in_us = NSYS_OLD.replace("Total Time (ns)", "Total Time (us)")
    path = tmp_path / "step_gpukernsum.csv"
    path.write_text(in_us)
    rows = read_nsys_kernel_summary(path)  # a path works as well as the text
    assert rows[0].total_ns == 3_000_000 and rows[0].avg_ns == 1_000_000


def test_nsys_reader_refuses_a_table_it_cannot_find():
    with pytest.raises(ValueError, match="no nsys kernel summary"):
        read_nsys_kernel_summary("SKIPPED: report1.sqlite does not contain CUDA kernel data.\n")
    with pytest.raises(ValueError, match="Num Calls"):
        read_nsys_api_summary(NSYS_OLD)


def test_ncu_details_page_with_preamble_units_and_rules():
    saxpy, tiny, gemm = read_ncu_report(NCU_STDOUT)
    assert (saxpy.name, saxpy.block_size, saxpy.grid_size) == ("saxpy", "(256, 1, 1)",
                                                             "(1024, 1, 1)")
    assert saxpy.duration_ns == pytest.approx(1_205_500)  # usecond, thousands separator
    assert saxpy.memory_throughput_pct == 88.1  # the % in SOL, not the GB/s of the other section
    assert saxpy.sm_throughput_pct == 12.3 and saxpy.registers_per_thread == 16
    assert saxpy.achieved_occupancy_pct == 81 and saxpy.theoretical_occupancy_pct == 100
    assert saxpy.metrics[("Launch Statistics", "Function Cache Configuration")][0] == (
        "CachePreferNone")
    assert saxpy.advice == ("Memory is more heavily utilized.",) and saxpy.bottleneck == "memory"
    assert tiny.duration_ns == pytest.approx(3100) and tiny.memory_throughput_pct is None
    assert tiny.bottleneck == "latency"
    # raw metric names (ncu --metrics ...) fill the same fields
    assert (gemm.duration_ns, gemm.sm_throughput_pct, gemm.dram_throughput_pct) == (
        52_000, 81.5, 35.0)
    assert gemm.bottleneck == "compute" and gemm.waves_per_sm is None


def test_ncu_reader_refuses_other_pages():
    with pytest.raises(ValueError, match="ncu details"):
        read_ncu_report('"Kernel Name","gpu__time_duration.sum"\n"k","100"\n')


@pytest.mark.parametrize(("sm", "memory", "expected"), [
    (80.0, 30.0, "compute"), (20.0, 85.0, "memory"), (45.0, 50.0, "latency"),
    (60.0, 59.9, "compute"), (None, None, "latency")])
def test_bottleneck_follows_the_speed_of_light(sm, memory, expected):
    kernel = NcuKernel(id=0, name="k", block_size="", grid_size="", duration_ns=1.0,
                       sm_throughput_pct=sm, memory_throughput_pct=memory,
                       dram_throughput_pct=None, achieved_occupancy_pct=None,
                       theoretical_occupancy_pct=None, registers_per_thread=None,
                       waves_per_sm=None)
    assert kernel.bottleneck == expected
