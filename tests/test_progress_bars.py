"""tqdm bars on gpulab's long calls: they show on stderr (a widget in a notebook) and
progress=False turns them off, for the tests and checkers that call these quietly."""

import torch

from gpulab.memory import checkpointing_tradeoff, find_max_batch, make_training_step
from gpulab.models import GPT, MLP, GPTConfig


def small_search(progress: bool):
    torch.manual_seed(0)
    model = MLP(8, 2, hidden=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = make_training_step(model, opt, lambda n: (torch.randn(n, 8),
                                                     torch.randint(0, 2, (n,))))
    return find_max_batch(step, 2**30, model=model, optimizer=opt, limit=20, progress=progress)


def test_find_max_batch_counts_its_tries(capsys):
    search = small_search(progress=True)
    bar = capsys.readouterr().err
    assert search.max_batch_size == 20
    assert "find_max_batch" in bar and f"{len(search.tries)}try" in bar.replace(" ", "")
    assert "largest batch that fits: 20" in bar
    assert small_search(progress=False) == search
    assert capsys.readouterr().err == ""


def test_checkpointing_tradeoff_shows_its_two_measurements(capsys):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1))
    batch = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    shown = checkpointing_tradeoff(model, batch, optimizer_class=torch.optim.SGD)
    bar = capsys.readouterr().err
    assert "checkpointing_tradeoff" in bar and "2/2" in bar and "checkpointed" in bar
    quiet = checkpointing_tradeoff(model, batch, optimizer_class=torch.optim.SGD,
                                   progress=False)
    assert capsys.readouterr().err == ""
    assert quiet.peak_bytes == shown.peak_bytes
