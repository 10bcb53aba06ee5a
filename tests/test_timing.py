import time

import pytest

import gpulab
from gpulab import timing


def test_benchmark_counts_calls_and_orders_statistics():
    calls = []
    t = timing.benchmark(lambda: calls.append(1), warmup=2, repeat=5)
    assert len(calls) == 7
    assert t.min_s <= t.median_s <= t.max_s
    assert t.repeat == 5 and t.device == "cpu"


def test_benchmark_measures_the_work():
    t = timing.benchmark(time.sleep, 0.02, warmup=0, repeat=3)
    assert t.median_s >= 0.02


def test_throughput_helpers():
    t = timing.Timing(median_s=0.5, min_s=0.4, max_s=0.6, repeat=3, device="cpu")
    assert t.gbps(2e9) == pytest.approx(4.0)
    assert t.tflops(3e12) == pytest.approx(6.0)


@pytest.mark.parametrize("seconds, text", [(2.0, "2.0 s"), (0.0123, "12.3 ms"),
                                           (4.5e-6, "4.5 us"), (3e-9, "3 ns")])
def test_format_seconds(seconds, text):
    assert timing.format_seconds(seconds) == text


def test_repeat_must_be_positive():
    with pytest.raises(ValueError, match="repeat"):
        timing.benchmark(lambda: None, repeat=0)


@pytest.mark.gpu
def test_cuda_events_time_queued_work():
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    t = timing.benchmark(torch.matmul, a, a)
    assert t.device == "cuda"
    assert 0 < t.tflops(2 * 4096**3) < 2000


def test_show_source_prints_the_library_code(capsys):
    gpulab.show_source(timing.format_seconds)
    out = capsys.readouterr().out
    assert out.startswith("# gpulab/timing.py, line ")
    assert "def format_seconds" in out


def test_show_source_unwraps_a_numba_kernel(capsys):
    from gpulab.kernels import reduce

    gpulab.show_source(reduce.reduce_kernel_v2)
    out = capsys.readouterr().out
    assert out.startswith("# gpulab/kernels/reduce.py, line ")
    assert "def reduce_kernel_v2" in out


def test_show_source_unwraps_a_decorated_method(capsys):
    from gpulab.distributed.data_parallel import OverlappedDDP  # no_sync is a @contextmanager

    gpulab.show_source(OverlappedDDP.no_sync)
    out = capsys.readouterr().out
    assert out.startswith("# gpulab/distributed/data_parallel.py, line ")
    assert "def no_sync" in out
