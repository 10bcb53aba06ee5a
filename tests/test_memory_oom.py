"""gpulab.memory OOM helpers: explain_oom names the category that filled the budget;
find_max_batch returns the largest batch that fits (it fits, one more does not), freeing
memory between tries."""

import pytest
import torch

from gpulab.memory import (
    explain_oom,
    find_max_batch,
    make_training_step,
    measure_step,
    memory_budget,
    training_step,
)
from gpulab.models import MLP


def fails(model, opt, batch, budget_bytes) -> torch.OutOfMemoryError | None:
    try:
        with memory_budget(budget_bytes, model=model, optimizer=opt, tensors=batch):
            training_step(model, opt, batch)
    except torch.OutOfMemoryError as error:
        error.__traceback__ = None  # keep the record, let the failed step's tensors go
        return error
    return None


@pytest.mark.parametrize("case, dominant", [
    ((MLP(32, 10, hidden=64), 2048), "activations"),  # a big batch through a small model
    ((MLP(256, 10, hidden=512, n_hidden=3), 2), "optimizer"),  # Adam's two moments dominate
])
def test_explain_oom_names_the_dominant_category(case, dominant):
    torch.manual_seed(0)
    (model, batch_size) = case
    opt = torch.optim.Adam(model.parameters())
    batch = (torch.randn(batch_size, model.net[0].in_features),
             torch.randint(0, 10, (batch_size,)))
    peak = measure_step(model, batch, opt).peak_bytes
    error = fails(model, opt, batch, int(peak * 0.95))
    assert error is not None
    report = explain_oom(error)
    assert report.dominant == dominant, str(report)
    assert report.live.total + report.tried_bytes > report.budget_bytes
    text = str(report)
    assert dominant in text and "Try:" in text and report.advice[0] in text


def test_explain_oom_needs_a_record():
    with pytest.raises(ValueError, match="memory_budget"):
        explain_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB."))


def test_find_max_batch_returns_the_largest_batch_that_fits():
    torch.manual_seed(0)
    model = MLP(16, 4, hidden=32)
    opt = torch.optim.Adam(model.parameters())
    gen = torch.Generator().manual_seed(0)

    def make_batch(n):
        return torch.randn(n, 16, generator=gen), torch.randint(0, 4, (n,), generator=gen)

    step = make_training_step(model, opt, make_batch)
    budget_bytes = 64 * 2**10
    search = find_max_batch(step, budget_bytes, model=model, optimizer=opt, limit=4096)
    n = search.max_batch_size
    assert 8 < n < 4096, str(search)
    sizes = [size for size, _ in search.tries]
    assert sizes[:3] == [1, 2, 4]  # doubling first, then bisection
    assert (n, True) in search.tries and (n + 1, False) in search.tries

    def fits(batch_size):
        try:
            with memory_budget(budget_bytes, model=model, optimizer=opt):
                step(batch_size)
            return True
        except torch.OutOfMemoryError:
            return False

    assert fits(n) and not fits(n + 1)
    assert str(n) in str(search)


def test_find_max_batch_limits():
    model = MLP(8, 2, hidden=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = make_training_step(model, opt, lambda n: (torch.randn(n, 8),
                                                     torch.randint(0, 2, (n,))))
    everything = find_max_batch(step, 2**30, model=model, optimizer=opt, limit=100)
    assert everything.max_batch_size == 100
    nothing = find_max_batch(step, 16, model=model, optimizer=opt)
    assert nothing.max_batch_size == 0 and nothing.tries == ((1, False),)
