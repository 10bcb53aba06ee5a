"""gpulab.memory budgets: a step under a budget raises torch.OutOfMemoryError (the type CUDA
raises) at the allocation that crosses it, with CUDA's message shape, in forward, backward or
the optimizer step; everything is freed and unhooked afterwards; on a GPU, the real error."""

import gc
import re

import pytest
import torch

from gpulab.memory import measure_step, memory_budget, training_step
from gpulab.models import MLP

MESSAGE = re.compile(r"out of memory.* Tried to allocate [\d.]+ (MiB|KiB|bytes)\. .* total "
                     r"capacity of [\d.]+ (MiB|KiB).* of which [\d.]+ (MiB|KiB|bytes) is free")


def setup(batch_size=128):
    torch.manual_seed(0)
    model = MLP(64, 10, hidden=128)
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,)))
    peak = measure_step(model, batch, opt, record_timeline=True)
    return model, opt, batch, peak


def test_the_allocation_that_crosses_the_budget_raises():
    with memory_budget(10_000, device="cpu") as budget:  # the simulated budget, on any runner
        kept = torch.empty(1000)  # 4000 bytes: fits
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(2000)  # 8000 more would make 12000
        assert budget.tracker.live_bytes == 4000  # the failed tensor was never handed out
        more = torch.empty(1500)  # 6000: exactly fills the budget, and fits
    record = info.value.oom_record
    assert (record.tried_bytes, record.live.total, record.budget_bytes) == (8000, 4000, 10_000)
    assert "Tried to allocate 7.81 KiB" in str(info.value) and "Simulated" in str(info.value)
    assert budget.peak_bytes == 10_000
    del kept, more


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_a_training_step_fails_in_each_phase_with_the_cuda_message(phase):
    # a big batch peaks in backward; a tiny one in Adam's update (model states dominate)
    model, opt, batch, measured = setup(batch_size=2 if phase == "optimizer" else 128)
    highest = {}  # the most bytes live in each phase
    for p, live in measured.timeline:
        highest[p] = max(highest.get(p, 0), live)
    budget_bytes = highest[phase] - 1  # one byte short: fails in that phase, not before
    assert budget_bytes >= max(v for p, v in highest.items() if p != phase) or phase == "forward"
    with pytest.raises(torch.OutOfMemoryError) as info:
        with memory_budget(budget_bytes, model=model, optimizer=opt, tensors=batch):
            training_step(model, opt, batch)
    record, message = info.value.oom_record, str(info.value)
    assert record.phase == phase
    assert record.live.total <= budget_bytes < record.live.total + record.tried_bytes
    assert MESSAGE.search(message), message
    del info  # its traceback holds the failed step's frames, and their tensors
    gc.collect()
    with memory_budget(measured.peak_bytes, model=model, optimizer=opt, tensors=batch) as fits:
        training_step(model, opt, batch)
    assert fits.peak_bytes == measured.peak_bytes


def test_nothing_is_left_behind_after_an_oom():
    from test_memory_tracker import tracker_is_gone

    model, opt, batch, measured = setup()
    opt.zero_grad(set_to_none=True)
    budget = memory_budget(measured.peak_bytes // 2, model=model, optimizer=opt, tensors=batch)
    baseline = None
    try:
        with budget:
            baseline = budget.tracker.live_bytes
            training_step(model, opt, batch)
    except torch.OutOfMemoryError:
        pass  # leaving the except block drops the traceback and the frames that held tensors
    gc.collect()
    opt.zero_grad(set_to_none=True)
    # the tracker still hears frees after exit: back to parameters, state and batch
    assert budget.tracker.live_bytes == baseline
    assert tracker_is_gone(model)
    training_step(model, opt, batch)  # and an ordinary step runs untracked


@pytest.mark.gpu
def test_gpu_budget_raises_the_real_cuda_error_and_restores_the_limit():
    model = MLP(1024, 10, hidden=4096).cuda()
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randn(8192, 1024), torch.randint(0, 10, (8192,)))
    get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    before = get() if get else None
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory") as info:
        with memory_budget(256 * 2**20, model=model, optimizer=opt, tensors=batch):
            training_step(model, opt, tuple(t.cuda() for t in batch))
    assert info.value.oom_record.tried_bytes > 0
    if get:
        assert get() == before
    gc.collect()
    torch.cuda.empty_cache()
    training_step(model, opt, tuple(t.cuda() for t in batch))  # the limit is gone
