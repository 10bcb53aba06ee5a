"""Lab 2's checkers pass correct training code and fail, with the message that teaches, on the
known wrong versions: the six bugs planted in the release's starting code (blocking copies,
backward inside autocast, clipping before unscaling, micro-batches weighted by their count, a
checkpoint without the scaler's state, a memorization run whose x and y drift apart), each alone
and all together as the release hands them out, and the wrong fixes a learner may write on the
way (a step without scaler.update(), zero_grad in the wrong place, a snapshot that holds
references, a resume that forgets the optimizer's state...)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from grading_specs import LAB2 as SPEC
from lab_submissions import run_in_process

from gpulab.checks import lab2
from gpulab.checks import lab2 as lab2_resume
from gpulab.checks.harness import training
from gpulab.train import cross_entropy

pytestmark = pytest.mark.lab2


# ----------------------------------------------------------------------------- Part 1


def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_device_blocking(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device_blocking(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device_blocking(v, device) for v in batch)
    return batch


def to_device_tuple_only(batch, device):
    """The library's loop moves an (x, y) pair; a dict passes through untouched."""
    if isinstance(batch, tuple):
        return tuple(t.to(device, non_blocking=True) for t in batch)
    return batch


def to_device_one_level(batch, device):
    """Moves the tensors of the outer container only."""
    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                           for v in batch)
    return batch.to(device, non_blocking=True) if isinstance(batch, torch.Tensor) else batch


def to_device_lists(batch, device):
    """Every container comes back a list."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device_lists(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return [to_device_lists(v, device) for v in batch]
    return batch


def to_device_everything(batch, device):
    """Calls .to on anything that is not a container: a string has no .to."""
    if isinstance(batch, dict):
        return {k: to_device_everything(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device_everything(v, device) for v in batch)
    return batch.to(device, non_blocking=True)


def test_to_device_passes_a_correct_function():
    lab2.check_to_device(to_device)
    lab2.check_to_device(to_device, nested=True)


def test_to_device_catches_blocking_copies():
    with pytest.raises(AssertionError, match=r"2 of 2 tensor copies were not asynchronous.*"
                                             r"non_blocking=True"):
        lab2.check_to_device(to_device_blocking)


def test_to_device_catches_a_batch_that_is_not_moved():
    with pytest.raises(AssertionError, match=r"batch\['x'\] is on cpu, expected meta\. Recurse"):
        lab2.check_to_device(to_device_tuple_only)


def test_to_device_catches_a_missing_recursion_only_in_nested_batches():
    lab2.check_to_device(to_device_one_level)  # (x, y) and flat dicts: nothing to recurse into
    with pytest.raises(AssertionError, match=r"batch\[0\]\[0\] is on cpu.*at any depth"):
        lab2.check_to_device(to_device_one_level, nested=True)


def test_to_device_catches_a_container_of_another_type():
    with pytest.raises(AssertionError, match=r"batch is a list, expected a tuple: keep each "
                                             r"container's type"):
        lab2.check_to_device(to_device_lists)


def test_to_device_reports_an_error_with_the_case():
    with pytest.raises(AssertionError, match=r"to_device \(a dict batch to meta\) raised "
                                             r"AttributeError"):
        lab2.check_to_device(to_device_everything, nested=True)


def test_a_function_from_gpulab_earns_nothing():
    with pytest.raises(AssertionError, match=r"gpulab's gpulab\.train\.cross_entropy.*earns no "
                                             r"points"):
        lab2.check_to_device(cross_entropy)
    with pytest.raises(AssertionError, match=r"to_device is not a function"):
        lab2.check_to_device(None)


def test_a_stub_says_what_to_replace():
    def stub(batch, device):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match=r"raised NotImplementedError.*\nReplace `raise "
                                             r"NotImplementedError\(\)` with your code"):
        lab2.check_to_device(stub)


# ----------------------------------------------------------------------------- Part 2


def make_amp_step(zero="start", update=True, clip="after_unscale", step="scaler",
                  scaled_backward=True, autocast=True, backward_in_autocast=False,
                  returns="detach"):
    """An amp_step, right by default; each argument makes one known mistake."""

    def amp_step(model, optimizer, scaler, x, y, recipe, clip_norm=None):
        if zero == "start":
            optimizer.zero_grad(set_to_none=True)
        context = (torch.autocast(recipe.device_type, dtype=recipe.dtype) if autocast
                   else torch.autocast(recipe.device_type, enabled=False))
        with context:
            loss = F.cross_entropy(model(x), y)
            if backward_in_autocast:
                scaler.scale(loss).backward()
        if not backward_in_autocast:
            (scaler.scale(loss) if scaled_backward else loss).backward()
        if zero == "before_step":
            optimizer.zero_grad()
        if clip_norm is not None and clip != "none":
            if clip == "after_unscale":
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if step == "scaler":
            scaler.step(optimizer)
        else:
            optimizer.step()
        if update:
            scaler.update()
        if zero == "end":
            optimizer.zero_grad()
        return {"detach": loss.detach(), "attached": loss, "item": loss.item(),
                "scaled": scaler.scale(loss).detach()}[returns]

    return amp_step


def test_amp_step_passes_a_correct_step():
    amp_step = make_amp_step()
    lab2.check_amp_step(amp_step)
    lab2.check_amp_step(amp_step, clip=False, seed=3)


def test_amp_step_catches_a_step_without_update():
    with pytest.raises(AssertionError, match=r"the scale is still 1024 after the step, expected "
                                             r"2048: scaler\.update\(\) was not called"):
        lab2.check_amp_step(make_amp_step(update=False))


def test_amp_step_catches_clipping_before_unscaling():
    with pytest.raises(AssertionError, match=r"about 1024 times too small \(max \|dw\| = "
                                             r"(\S+), one SGD step on the true gradient: \S+\): "
                                             r"the gradients were clipped while still "
                                             r"multiplied by the scale.*"
                                             r"scaler\.unscale_\(optimizer\) before "
                                             r"clip_grad_norm_"):
        lab2.check_amp_step(make_amp_step(clip="before_unscale"))


def test_amp_step_catches_a_missing_clip():
    with pytest.raises(AssertionError, match=r"The gradients were not clipped"):
        lab2.check_amp_step(make_amp_step(clip="none"))
    lab2.check_amp_step(make_amp_step(clip="none"), clip=False)  # nothing to clip


def test_amp_step_catches_stale_gradients():
    for zero in ("never", "end"):
        with pytest.raises(AssertionError, match=r"includes the gradients that were in \.grad "
                                                 r"before the call.*zero_grad"):
            lab2.check_amp_step(make_amp_step(zero=zero))


def test_amp_step_catches_zero_grad_between_backward_and_step():
    with pytest.raises(AssertionError, match=r"the parameters did not move\. Is "
                                             r"optimizer\.zero_grad\(\) between backward"):
        lab2.check_amp_step(make_amp_step(zero="before_step"))


def test_amp_step_catches_autocast_around_backward():
    with pytest.raises(AssertionError, match=r"backward ran inside torch\.autocast \(1 of 1 "
                                             r"backward calls\)\. End the `with` block after "
                                             r"the loss"):
        lab2.check_amp_step(make_amp_step(backward_in_autocast=True))


def test_amp_step_catches_a_forward_outside_autocast():
    with pytest.raises(AssertionError, match=r"forward pass ran outside autocast.*"
                                             r"recipe\.device_type"):
        lab2.check_amp_step(make_amp_step(autocast=False))


def test_amp_step_catches_an_unscaled_backward():
    with pytest.raises(AssertionError, match=r"raised AssertionError: Attempted unscale_ but "
                                             r"_scale is None.*\nRun backward on "
                                             r"scaler\.scale\(loss\)"):
        lab2.check_amp_step(make_amp_step(scaled_backward=False))


def test_amp_step_catches_optimizer_step_instead_of_scaler_step():
    # Without clipping the optimizer sees S-times gradients; with clipping (unscale_ first)
    # the clean step is right, and the batch holding inf makes the weights NaN.
    with pytest.raises(AssertionError, match=r"1024 times too big \(max \|dw\| = 66, one SGD "
                                             r"step on the true gradient: 0\.0645\): "
                                             r"optimizer\.step\(\) used gradients still "
                                             r"multiplied"):
        lab2.check_amp_step(make_amp_step(step="optimizer", update=False), clip=False)
    with pytest.raises(AssertionError, match=r"an inf in the batch\): 4 of 4 parameter tensors "
                                             r"became NaN.*scaler\.step\(optimizer\) checks"):
        lab2.check_amp_step(make_amp_step(step="optimizer"))


def test_amp_step_catches_weights_that_move_on_the_overflowing_step():
    def sanitizing_step(model, optimizer, scaler, x, y, recipe, clip_norm=None):
        """Replaces the gradients that overflowed and steps anyway."""
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(recipe.device_type, dtype=recipe.dtype):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        for p in model.parameters():
            p.grad.nan_to_num_(nan=1.0, posinf=1.0, neginf=-1.0)
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        scaler.update()
        return loss.detach()

    with pytest.raises(AssertionError, match=r"an inf in the batch\): the weights moved on the "
                                             r"overflowing step \(max \|dw\| = 0\.\d+\); the "
                                             r"step must be skipped"):
        lab2.check_amp_step(sanitizing_step)


def test_amp_step_catches_update_before_step():
    def update_first(model, optimizer, scaler, x, y, recipe, clip_norm=None):
        optimizer.zero_grad()
        with torch.autocast(recipe.device_type, dtype=recipe.dtype):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.update()
        scaler.step(optimizer)
        return loss.detach()

    with pytest.raises(AssertionError, match=r"raised AssertionError: No inf checks.*\n.*"
                                             r"it comes after scaler\.step\(optimizer\)"):
        lab2.check_amp_step(update_first, clip=False)


@pytest.mark.parametrize("returns, message", [
    ("item", r"returned the number .*\.item\(\), float\(\)\) makes the host wait"),
    ("attached", r"still attached to the autograd graph: return loss\.detach\(\)"),
    ("scaled", r"the loss times the scale \(2048\): return the loss itself"),
])
def test_amp_step_catches_a_wrong_return_value(returns, message):
    with pytest.raises(AssertionError, match=message):
        lab2.check_amp_step(make_amp_step(returns=returns))


# ----------------------------------------------------------------------------- Part 3


def make_accumulate(weight="share", zero="once", scaled=True, returns="mean"):
    """An accumulate_gradients, right by default; each argument makes one known mistake."""

    def accumulate_gradients(model, micro_batches, scaler, recipe):
        if zero == "once":
            model.zero_grad(set_to_none=True)
        n = sum(len(x) for x, _ in micro_batches)
        total, plain = 0.0, 0.0
        for x, y in micro_batches:
            if zero == "each":
                model.zero_grad(set_to_none=True)
            with torch.autocast(recipe.device_type, dtype=recipe.dtype):
                loss = F.cross_entropy(model(x), y)
                plain = plain + loss.detach()
                loss = loss * {"share": len(x) / n, "count": 1 / len(micro_batches),
                               "none": 1.0}[weight]
            (scaler.scale(loss) if scaled else loss).backward()
            total = total + loss.detach()
        return total if returns == "mean" else plain

    return accumulate_gradients


def test_accumulate_passes_a_correct_function():
    accumulate = make_accumulate()
    lab2.check_accumulate_gradients(accumulate)
    lab2.check_accumulate_gradients(accumulate, sizes=[1, 7, 3, 2], seed=4)
    lab2.check_accumulate_gradients(accumulate, sizes=[12])


def test_accumulate_catches_a_loss_that_is_not_divided():
    with pytest.raises(AssertionError, match=r"the sum of the micro-batches' mean gradients, "
                                             r"about 3 times.*len\(x\) / N \(N = 28"):
        lab2.check_accumulate_gradients(make_accumulate(weight="none"))


def test_accumulate_catches_dividing_by_the_count_for_unequal_sizes():
    with pytest.raises(AssertionError, match=r"divided by the number of micro-batches \(3\), so "
                                             r"each counts 1/3, while their shares of the 28 "
                                             r"examples are 16/28, 8/28, 4/28\. That is right "
                                             r"only when they are all the same size.*off by "
                                             r"\d+% of the largest entry"):
        lab2.check_accumulate_gradients(make_accumulate(weight="count"))
    lab2.check_accumulate_gradients(make_accumulate(weight="count"), sizes=[6, 6])


def test_accumulate_catches_zero_grad_inside_the_loop():
    with pytest.raises(AssertionError, match=r"Only the last micro-batch's gradient is left: "
                                             r"the gradients were zeroed inside the loop"):
        lab2.check_accumulate_gradients(make_accumulate(zero="each"))


def test_accumulate_catches_stale_gradients_and_an_unscaled_backward():
    with pytest.raises(AssertionError, match=r"include what was in \.grad before the call"):
        lab2.check_accumulate_gradients(make_accumulate(zero="never"))
    with pytest.raises(AssertionError, match=r"1024 times too small: backward ran on the loss"):
        lab2.check_accumulate_gradients(make_accumulate(scaled=False))


def test_accumulate_catches_the_sum_of_the_losses_returned():
    with pytest.raises(AssertionError, match=r"the sum of the micro-batches' mean losses; "
                                             r"return the batch's mean loss"):
        lab2.check_accumulate_gradients(make_accumulate(returns="sum"))


# ----------------------------------------------------------------------------- Part 4


def make_snapshot(copied=True, optimizer=True, scaler=True, rng=True, numpy_state=False):
    def snapshot(model, opt, grad_scaler, step):
        snap = {"model": model.state_dict(), "step": step}
        if optimizer:
            snap["optimizer"] = opt.state_dict()
        if scaler:
            snap["scaler"] = grad_scaler.state_dict()
        if rng:
            snap["rng"] = torch.get_rng_state()
        if numpy_state:
            import numpy as np

            snap["numpy"] = np.random.get_state()
        return copy.deepcopy(snap) if copied else snap

    return snapshot


def make_restore(optimizer=True, scaler=True, step_offset=0):
    def restore(snap, model, opt, grad_scaler):
        model.load_state_dict(snap["model"])
        if optimizer and "optimizer" in snap:
            opt.load_state_dict(snap["optimizer"])
        if scaler and "scaler" in snap:
            grad_scaler.load_state_dict(snap["scaler"])
        if "rng" in snap:
            torch.set_rng_state(snap["rng"])
        return snap["step"] + step_offset

    return restore


def test_resume_passes_a_correct_pair():
    lab2_resume.check_resume(make_snapshot(), make_restore())
    lab2_resume.check_resume(make_snapshot(), make_restore(), steps_before=0, steps_after=2, seed=5)


def test_resume_leaves_the_notebooks_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    lab2_resume.check_resume(make_snapshot(), make_restore())
    assert torch.equal(torch.get_rng_state(), before)


def test_resume_catches_a_forgotten_optimizer_state():
    message = r"the optimizer's state was not restored\. AdamW keeps.*optimizer\.state_dict\(\)"
    with pytest.raises(AssertionError, match=message):
        lab2_resume.check_resume(make_snapshot(), make_restore(optimizer=False))
    with pytest.raises(AssertionError, match=message):
        lab2_resume.check_resume(make_snapshot(optimizer=False), make_restore())


def test_resume_catches_a_snapshot_that_holds_references():
    with pytest.raises(AssertionError, match=r"the weights are those from the end of the run.*"
                                             r"copy\.deepcopy\(model\.state_dict\(\)\)"):
        lab2_resume.check_resume(make_snapshot(copied=False), make_restore())


def test_resume_catches_a_forgotten_scaler_and_random_state():
    with pytest.raises(AssertionError, match=r"the GradScaler was not restored: scale 1024\.0, "
                                             r"growth tracker 0; at the snapshot they were "
                                             r"2048\.0 and 1 \(the snapshot holds no GradScaler "
                                             r"state\)"):
        lab2_resume.check_resume(make_snapshot(scaler=False), make_restore())
    with pytest.raises(AssertionError, match=r"\(the snapshot holds the GradScaler's state, but "
                                             r"restore did not load it\)"):
        lab2_resume.check_resume(make_snapshot(), make_restore(scaler=False))
    with pytest.raises(AssertionError, match=r"torch's random state was not restored\. Dropout "
                                             r"masks and the order of the batches"):
        lab2_resume.check_resume(make_snapshot(rng=False), make_restore())


def test_resume_catches_a_wrong_step_and_an_unsafe_snapshot():
    with pytest.raises(AssertionError, match=r"restore \(.*\) returned 4, expected 3"):
        lab2_resume.check_resume(make_snapshot(), make_restore(step_offset=1))
    with pytest.raises(AssertionError, match=r"weights_only=True\) refused it \(.*Unsupported "
                                             r"global.*numpy.*Keep only tensors"):
        lab2_resume.check_resume(make_snapshot(numpy_state=True), make_restore())


# ----------------------------------------------------------------------------- Part 5


def make_memorize(pair="same", returns="floats", train_copy=False, other_params=False):
    amp_step = make_amp_step()

    def memorize(model, x, y, recipe, steps=100, lr=1e-2):
        if train_copy:
            model = copy.deepcopy(model)
        params = copy.deepcopy(model).parameters() if other_params else model.parameters()
        optimizer = torch.optim.AdamW(params, lr=lr)
        scaler = torch.amp.GradScaler(recipe.device_type, enabled=recipe.use_grad_scaler)
        model.train()
        losses = []
        for _ in range(steps):
            xs = x[torch.randperm(len(x))] if pair == "shuffled_x" else x
            losses.append(amp_step(model, optimizer, scaler, xs, y, recipe))
        return torch.stack(losses).tolist() if returns == "floats" else losses

    return memorize


def test_memorize_passes_a_correct_function():
    lab2_resume.check_memorize(make_memorize())
    lab2_resume.check_memorize(make_memorize(), grad_scaler=True, seed=2)


def test_memorize_catches_x_and_y_drifting_apart():
    with pytest.raises(AssertionError, match=r"memorization test fails: the weights moved "
                                             r"\(max \|dw\| = \S+\) and the losses returned "
                                             r"stayed near 1\.\d+.*x and y no longer paired"):
        lab2_resume.check_memorize(make_memorize(pair="shuffled_x"))


def test_memorize_catches_an_optimizer_over_other_parameters():
    with pytest.raises(AssertionError, match=r"weights never moved \(max \|dw\| = 0\): the "
                                             r"optimizer holds other parameters"):
        lab2_resume.check_memorize(make_memorize(other_params=True))


def test_memorize_catches_tensors_returned_and_a_copy_trained():
    with pytest.raises(AssertionError, match=r"returned a list of Tensor; return Python floats"):
        lab2_resume.check_memorize(make_memorize(returns="tensors"))
    with pytest.raises(AssertionError, match=r"another model learned: train the model passed "
                                             r"in, not a copy"):
        lab2_resume.check_memorize(make_memorize(train_copy=True))


def test_the_checkers_never_run_fp16_on_the_cpu():
    for recipe in (training.BF16, training.BF16_SCALED):
        assert recipe.device_type == "cpu" and recipe.dtype == torch.bfloat16
    assert math.log2(training.SCALE).is_integer()


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message."""
    SPEC.expect_checker_teaches(mistake)


def test_the_release_hands_out_the_buggy_loop_and_each_part_fails_on_a_planted_bug():
    """The untouched release runs (no stub raises) and fails every test cell, visible and hidden
    tests included, with the message of a bug planted in that part (grading_checks grades it
    end to end too)."""
    released = SPEC.lab.released()
    assert "NotImplementedError" not in "".join(c.source for c in released.cells)
    assert set(SPEC.untouched_says) == set(SPEC.assignment.points)
    for test, says in SPEC.untouched_says.items():
        error = run_in_process(released, test)
        assert error is not None and says in str(error), (test, error)
