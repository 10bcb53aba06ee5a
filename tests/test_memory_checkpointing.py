"""gpulab.memory checkpointing: checkpoint_blocks cuts the activations a GPT keeps for
backward and its peak, leaves its gradients unchanged, costs one more forward of the Blocks,
and leaves parameters and state_dict keys alone."""

import copy

import pytest
import torch

from gpulab.memory import (
    checkpoint_blocks,
    checkpointing_tradeoff,
    is_checkpointed,
    uncheckpoint_blocks,
)
from gpulab.models import GPT, GPTConfig
from gpulab.train import cross_entropy


def gpt_and_batch(n_layer=2):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=n_layer)), (torch.randint(0, 64, (4, 32)),
                                             torch.randint(0, 64, (4, 32)))


def test_checkpointing_saves_memory_for_compute():
    model, batch = gpt_and_batch()
    result = checkpointing_tradeoff(model, batch, optimizer_class=torch.optim.SGD)
    assert result.saved_activation_bytes_checkpointed < result.saved_activation_bytes / 4
    assert result.peak_bytes_checkpointed < result.peak_bytes
    assert 0.1 < result.extra_compute < 0.4  # one more forward of the Blocks: < 1/3 of a step
    assert 0 < result.memory_saved < 1
    assert "FLOPs" in str(result)
    assert not any(is_checkpointed(b) for b in model.blocks)  # it worked on copies


def test_checkpointed_gradients_equal_plain_ones():
    model, (x, y) = gpt_and_batch()
    twin = checkpoint_blocks(copy.deepcopy(model))
    assert all(is_checkpointed(b) for b in twin.blocks)
    assert list(twin.state_dict()) == list(model.state_dict())
    cross_entropy(model(x), y).backward()
    cross_entropy(twin(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=f"gradient of {name} differs")


def test_uncheckpoint_and_copies():
    model, (x, _) = gpt_and_batch()
    checkpoint_blocks(model)
    clone = copy.deepcopy(model)  # the copy is checkpointed and runs its own weights
    assert all(is_checkpointed(b) for b in clone.blocks)
    with torch.no_grad():
        clone.blocks[0].ln_1.weight.mul_(2)
    assert not torch.equal(clone(x), model(x))
    uncheckpoint_blocks(model)
    assert not any(is_checkpointed(b) for b in model.blocks)
    with pytest.raises(ValueError, match="blocks="):
        checkpoint_blocks(torch.nn.Linear(2, 2))
