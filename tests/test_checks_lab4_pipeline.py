"""Lab 4 Part B's checkers pass a right fast_train and fail, with the message that teaches, on the
known wrong ones: another order of the examples, a re-seeded generator each pass, the transform
left out or changed, a summed loss, half the batch, a copy of the model trained, the last update
missing, tensors returned, TF32 switched on; and, for speed, versions that keep one of
slow_train's costs (the Python transform, work per example, micro-batches, reads every step),
each told which one it kept. slow_train itself is deterministic."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from gpulab.checks.lab4 import check_fast_results, check_speedup
from gpulab.slow_pipeline import (
    MICRO_BATCH_SIZE,
    TransformedDigits,
    example_order,
    pipeline_problem,
    slow_train,
)

pytestmark = pytest.mark.lab4


def standardized(images, correction=0):
    v = images.reshape(len(images), 64).float() / 16  # (N, 64)
    return (v - v.mean(1, keepdim=True)) / v.std(1, correction=correction, keepdim=True)


def batch_order(n, steps, batch_size, seed, reseed_each_pass=False):
    passes = -(-steps * batch_size // n)
    g = torch.Generator().manual_seed(seed)
    perms = []
    for _ in range(passes):
        if reseed_each_pass:
            g = torch.Generator().manual_seed(seed)
        perms.append(torch.randperm(n, generator=g))
    return torch.cat(perms)[: steps * batch_size].view(steps, batch_size)  # (steps, B)


def _train(model, optimizer, x_all, y_all, order, reduction="mean", skip_last=False):
    losses = []
    for step, idx in enumerate(order):
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx], reduction=reduction)
        optimizer.zero_grad()
        loss.backward()
        if not (skip_last and step == len(order) - 1):
            optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


def fast_train(model, optimizer, images, labels, *, steps, batch_size, seed):
    """The transform once for all images, one batch a step, no syncs until the end."""
    device = next(model.parameters()).device
    x_all, y_all = standardized(images).to(device), labels.to(device)
    order = batch_order(len(labels), steps, batch_size, seed).to(device)
    return _train(model, optimizer, x_all, y_all, order)


def fast_unshuffled(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = torch.arange(steps * batch_size).remainder(len(labels)).view(steps, batch_size)
    return _train(model, optimizer, standardized(images), labels, order)


def fast_reseeded(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = batch_order(len(labels), steps, batch_size, seed, reseed_each_pass=True)
    return _train(model, optimizer, standardized(images), labels, order)


def fast_scaled_only(model, optimizer, images, labels, *, steps, batch_size, seed):
    x_all = images.reshape(len(images), 64).float() / 16
    order = batch_order(len(labels), steps, batch_size, seed)
    return _train(model, optimizer, x_all, labels, order)


def fast_unbiased_std(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = batch_order(len(labels), steps, batch_size, seed)
    return _train(model, optimizer, standardized(images, correction=1), labels, order)


def fast_summed(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = batch_order(len(labels), steps, batch_size, seed)
    return _train(model, optimizer, standardized(images), labels, order, reduction="sum")


def fast_half_batch(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = batch_order(len(labels), steps, batch_size // 2, seed)
    return _train(model, optimizer, standardized(images), labels, order)


def fast_on_a_copy(model, optimizer, images, labels, *, steps, batch_size, seed):
    twin = type(model)(64, 10, hidden=model.net[0].out_features, n_hidden=1)
    twin.load_state_dict(model.state_dict())
    twin_optimizer = torch.optim.SGD(twin.parameters(), **{
        k: optimizer.defaults[k] for k in ("lr", "momentum")})
    return fast_train(twin, twin_optimizer, images, labels, steps=steps, batch_size=batch_size,
                      seed=seed)


def fast_skip_last(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = batch_order(len(labels), steps, batch_size, seed)
    return _train(model, optimizer, standardized(images), labels, order, skip_last=True)


def fast_tensor(model, optimizer, images, labels, *, steps, batch_size, seed):
    losses = fast_train(model, optimizer, images, labels, steps=steps, batch_size=batch_size,
                        seed=seed)
    return torch.tensor(losses)


def fast_tf32(model, optimizer, images, labels, *, steps, batch_size, seed):
    torch.set_float32_matmul_precision("high")
    return fast_train(model, optimizer, images, labels, steps=steps, batch_size=batch_size,
                      seed=seed)


def fast_no_item(model, optimizer, images, labels, *, steps, batch_size, seed):
    """slow_train with its .item(), isfinite and .cpu() calls removed: nothing else changed."""
    order = example_order(len(labels), steps, batch_size, seed)
    loader = DataLoader(TransformedDigits(images, labels), batch_size=MICRO_BATCH_SIZE,
                        sampler=order)
    micro_batches, losses = iter(loader), []
    for _ in range(steps):
        optimizer.zero_grad()
        step_loss = 0
        for _ in range(batch_size // MICRO_BATCH_SIZE):
            x, y = next(micro_batches)
            loss = F.cross_entropy(model(x), y) * (len(y) / batch_size)
            loss.backward()
            step_loss = step_loss + loss.detach()
        optimizer.step()
        losses.append(step_loss)
    return torch.stack(losses).tolist()


class TensorOpsDigits(Dataset):
    """The transform in tensor operations, but still one example at a time."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        v = self.images[i].reshape(64).float() / 16
        return (v - v.mean()) / v.std(correction=0), self.labels[i]


def fast_per_example_tensor_ops(model, optimizer, images, labels, *, steps, batch_size, seed):
    order = example_order(len(labels), steps, batch_size, seed)
    loader = DataLoader(TensorOpsDigits(images, labels), batch_size=batch_size, sampler=order)
    losses = []
    for x, y in loader:  # steps batches: the sampler holds steps * batch_size indices
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


def fast_micro_batches(model, optimizer, images, labels, *, steps, batch_size, seed):
    """The transform done once, no syncs, but slow_train's micro-batches kept."""
    x_all, losses = standardized(images), []
    for idx in batch_order(len(labels), steps, batch_size, seed):
        optimizer.zero_grad()
        loss = 0
        for part in idx.split(MICRO_BATCH_SIZE):
            share = len(part) / batch_size
            micro_loss = F.cross_entropy(model(x_all[part]), labels[part]) * share
            micro_loss.backward()
            loss = loss + micro_loss.detach()
        optimizer.step()
        losses.append(loss)
    return torch.stack(losses).tolist()


def fast_read_every_step(model, optimizer, images, labels, *, steps, batch_size, seed):
    """fast_train, but each step's loss read with .item() as it comes."""
    x_all, losses = standardized(images), []
    for idx in batch_order(len(labels), steps, batch_size, seed):
        loss = F.cross_entropy(model(x_all[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def failure_message(check, fn, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        check(fn, **kwargs)
    return str(info.value)


def test_slow_train_is_deterministic():
    problem = pipeline_problem(seed=3, steps=12)
    (first, model_a), (second, model_b) = problem.run(slow_train), problem.run(slow_train)
    assert first == second
    assert all(torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(),
                                                 strict=True))
    assert first != pipeline_problem(seed=4, steps=12).run(slow_train)[0]  # the seed matters


def test_slow_train_order_follows_example_order():
    """Step 0's loss is the fresh model's mean loss on the first batch of example_order."""
    problem = pipeline_problem(seed=1, steps=1)
    losses, _ = problem.run(slow_train)
    idx = torch.tensor(example_order(len(problem.labels), 1, problem.batch_size, seed=1))
    with torch.no_grad():
        model = problem.new_model()
        want = F.cross_entropy(model(standardized(problem.images)[idx].to(problem.device)),
                               problem.labels[idx].to(problem.device))
    assert losses[0] == pytest.approx(float(want), rel=1e-5)


def test_right_fast_train_passes_results():
    check_fast_results(fast_train)
    check_fast_results(fast_train, seed=5, steps=60)


@pytest.mark.parametrize("wrong, expected", [
    (fast_unshuffled, "in the order they are stored"),
    (fast_reseeded, "Step 28 is the first to use the second pass"),
    (fast_scaled_only, "scaled to [0, 1] (pixel / 16) but not standardized"),
    (fast_unbiased_std, "correction=0"),
    (fast_summed, "summed loss"),
    (fast_half_batch, "first 32 examples"),
    (fast_on_a_copy, "parameters did not change"),
    (fast_skip_last, "last step's optimizer.step() missing"),
    (fast_tensor, "torch.stack(losses).tolist()"),
    (fast_tf32, "switched fp32 matrix multiplies to TF32"),
    (slow_train, "gpulab's"),
])
def test_wrong_fast_train_fails_with_its_message(wrong, expected):
    assert expected in failure_message(check_fast_results, wrong)


def test_checks_run_in_full_fp32_and_restore_the_notebooks_setting():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what a notebook may have set
    try:
        check_fast_results(fast_train, steps=3)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_right_fast_train_is_fast_enough():
    check_speedup(fast_train)


TRANSFORM_KEPT = ("It still builds its inputs from Python values, 512 tensors a step "
                  "(slow_train 512)")


def test_dropping_only_the_item_calls_is_not_enough():
    # The same results (check_speedup checks them first), but too slow; the message says why.
    message = failure_message(check_speedup, fast_no_item)
    ratio = float(re.search(r"fast_train is ([\d.]+)x as fast", message).group(1))
    assert 0.5 < ratio < 3.0
    assert TRANSFORM_KEPT in message
    assert "model calls" in message and "ms a step" in message


# On a CPU only the Python transform keeps a fast_train under 3x (above); the other costs are
# named when the bar is out of reach, as on a GPU where they cost more: one round of 10 steps.
@pytest.mark.parametrize("kept, expected", [
    (fast_per_example_tensor_ops, r"It still works example by example: \d+ torch calls a step "
                                  r"for 64 examples"),
    (fast_micro_batches, r"It runs the model 8 times a step \(slow_train 8\): micro-batches"),
    (fast_read_every_step, r"It reads 1\.0 values a step back into Python"),
])
def test_a_slow_fast_train_is_told_which_cost_it_kept(kept, expected):
    message = failure_message(check_speedup, kept, min_speedup=100.0, steps=10, rounds=1)
    assert re.search(expected, message), message


def test_a_wrong_fast_train_earns_no_speed_points():
    assert "summed loss" in failure_message(check_speedup, fast_summed)
