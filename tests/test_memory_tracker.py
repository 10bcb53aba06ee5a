"""gpulab.memory tracker and measure: each storage counted once and taken off when freed,
categories right, the same peak as torch's own MemTracker, nothing left behind; on a GPU the
allocator's peak agrees with the tracked tensors."""

import gc

import pytest
import torch
import torch.nn.functional as F

from gpulab.memory import MemoryTracker, allocator_state, measure_step, training_step
from gpulab.memory.tracker import allocated_bytes, tried_allocation_bytes
from gpulab.models import GPT, MLP, GPTConfig


def tracker_is_gone(model=None):
    """No dispatch mode, gradient hook or optimizer hook of a MemoryTracker is left installed."""
    from torch.optim import optimizer as optim_module

    hooks = [h for p in (model.parameters() if model is not None else [])
             for h in (p._post_accumulate_grad_hooks or {}).values()]
    hooks += list(optim_module._global_optimizer_pre_hooks.values())
    hooks += list(optim_module._global_optimizer_post_hooks.values())
    ours = [h for h in hooks if "MemoryTracker" in getattr(h, "__qualname__", "")]
    return torch._C._len_torch_dispatch_stack() == 0 and not ours


def test_a_storage_counts_once_and_leaves_when_freed():
    with MemoryTracker() as tracker:
        a = torch.empty(1000)  # 4000 bytes
        views = [a[1:], a.view(10, 100), a[::2]]
        assert tracker.live_bytes == 4000
        b = a * 2
        assert tracker.live_bytes == 8000
        del a, views
        assert tracker.live_bytes == 4000  # a's storage is gone, b's is not
        del b
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 8000
    assert tracker.peak_breakdown.activations == 8000


def test_categories_of_a_training_step():
    torch.manual_seed(0)
    model = MLP(16, 4, hidden=32)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    with MemoryTracker(model=model, optimizer=opt, tensors=(x, y)) as tracker:
        live = tracker.live_breakdown()
        assert (live.parameters, live.optimizer, live.other) == (param_bytes, 0, 8 * 16 * 4 + 64)
        loss = F.cross_entropy(model(x), y)
        assert tracker.live_breakdown().activations > 0
        loss.backward()
        assert tracker.live_breakdown().gradients == param_bytes
        opt.step()  # the first step makes Adam's state: two buffers per parameter and a step
        assert tracker.live_breakdown().optimizer == 2 * param_bytes + 4 * 6
        assert tracker.live_breakdown().temporary == 0
        assert not tracker_is_gone(model)  # the check sees a tracker that is there
    assert tracker_is_gone(model)


def test_same_peak_as_torch_mem_tracker():
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randint(0, 64, (8, 32)), torch.randint(0, 64, (8, 32)))
    ours = measure_step(model, batch, opt)
    opt.zero_grad(set_to_none=True)
    theirs = mem_tracker.MemTracker()
    theirs.track_external(model, opt, *batch)
    with theirs:
        training_step(model, opt, batch)
    peak = theirs.get_tracker_snapshot("peak")[torch.device("cpu")]
    assert ours.peak_bytes == peak["Total"]


def test_measure_step_is_deterministic_and_records_a_timeline():
    torch.manual_seed(0)
    model = MLP(64, 10, hidden=128)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batch = (torch.randn(64, 64), torch.randint(0, 10, (64,)))
    first = measure_step(model, batch, opt, record_timeline=True)
    second = measure_step(model, batch, opt)
    assert first.peak_bytes == second.peak_bytes and first.breakdown == second.breakdown
    assert max(b for _, b in first.timeline) == first.peak_bytes
    assert {phase for phase, _ in first.timeline} >= {"forward", "backward"}
    assert first.breakdown.total == first.peak_bytes
    assert "measured on cpu" in first.table()
    assert tracker_is_gone(model)


def test_sizes_and_message_parsing():
    assert allocated_bytes(1, "cuda") == 512 and allocated_bytes(513, "cuda") == 1024
    assert allocated_bytes(513, "cpu") == 513
    assert tried_allocation_bytes("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 ...") \
        == 20 * 2**20
    assert tried_allocation_bytes("Tried to allocate 512 bytes.") == 512
    assert tried_allocation_bytes("something else") == 0


@pytest.mark.gpu
def test_gpu_allocator_peak_agrees_with_the_tracked_tensors():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_embd=256, block_size=256, vocab_size=512)).cuda()
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randint(0, 512, (16, 256)), torch.randint(0, 512, (16, 256)))
    m = measure_step(model, batch, opt)
    tracked = m.breakdown.total
    # the allocator sees the tensors plus kernels' workspaces: never less, not much more
    assert tracked <= m.peak_bytes <= 1.10 * tracked, m.table()
    gc.collect()


def test_allocator_state_is_cuda_only():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: see the gpu test")
    with pytest.raises(RuntimeError, match="MemoryTracker"):
        allocator_state()


@pytest.mark.gpu
def test_gpu_allocator_state_after_a_step():
    model = MLP(256, 10, hidden=1024).cuda()
    opt = torch.optim.Adam(model.parameters())
    training_step(model, opt, (torch.randn(512, 256, device="cuda"),
                               torch.randint(0, 10, (512,), device="cuda")))
    state = allocator_state()
    assert 0 < state.allocated_bytes <= state.reserved_bytes
    assert state.peak_allocated_bytes >= state.allocated_bytes
    assert 0 <= state.fragmentation < 1 and "reserved" in str(state)
