"""Lab 4, Part A: the OOM scenario keeps its promises (the plain step does not fit the budget;
accumulation over 3+ micro-batches, checkpointing, and bf16 with 2 micro-batches do), and the
checkers pass right answers and fail, with the message that teaches, on the known wrong ones: a
share given in percent or over the budget, an inverted ratio; an OOM, an undivided loss,
micro-batches of unequal size divided by k, half the batch, gradients zeroed in the loop, after
the step or never, a step per micro-batch, no step, an attached loss."""

import gc
import math

import pytest
import torch
import torch.nn.functional as F
from grading_specs import LAB4 as SPEC

from gpulab.checks.lab4 import check_diagnosis, check_fit_step
from gpulab.memory import MemoryTracker, checkpoint_blocks, measure_step, oom_scenario
from gpulab.memory.oom_scenario import budget_for

pytestmark = pytest.mark.lab4


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and other processes on the cores slow it least."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def accumulate(micro=4, n_microbatches=None, weight="share", amp=False, checkpoint=False,
               zero="start", step="once", take_half=False, detach=True):
    """A fit_step; the defaults are right, each argument can make one known mistake."""
    def fit_step(model, optimizer, x, y):
        if checkpoint:
            checkpoint_blocks(model)
        if take_half:
            x, y = x[: len(x) // 2], y[: len(y) // 2]
        if zero == "start":
            optimizer.zero_grad(set_to_none=True)
        if n_microbatches is None:
            parts = list(zip(x.split(micro), y.split(micro), strict=True))
        else:
            parts = list(zip(x.tensor_split(n_microbatches), y.tensor_split(n_microbatches),
                             strict=True))
        n, total = len(x), 0.0
        for x_micro, y_micro in parts:
            if zero == "inside":
                optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = _loss(model, x_micro, y_micro)
            loss = loss * {"share": len(x_micro) / n, "k": 1 / len(parts), "none": 1.0}[weight]
            loss.backward()
            total = total + (loss.detach() if detach else loss)
            if step == "each":
                optimizer.step()
        if step == "once":
            optimizer.step()
        if zero == "after":
            optimizer.zero_grad(set_to_none=True)
        return total
    return fit_step


def lesson_accumulation(model, optimizer, x, y):
    """Lesson 07's recipe: x.chunk(4), each loss divided by 4 (equal micro-batches only)."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for x_micro, y_micro in zip(x.chunk(4), y.chunk(4), strict=True):
        loss = _loss(model, x_micro, y_micro) / 4
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def forward_without_grad(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():  # "to save memory"
        loss = _loss(model, x, y)
    loss.backward()
    optimizer.step()
    return loss


def own_optimizer(model, optimizer, x, y):
    adam = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return accumulate()(model, adam, x, y)


# ----------------------------------------------------------------------------- the scenario


def test_scenario_is_seeded_and_the_budget_is_the_device():
    a, b = oom_scenario(), oom_scenario()
    (m1, _, x1, y1), (m2, _, x2, y2) = a.make(), b.make()
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters(), strict=True))
    _, _, x3, _ = oom_scenario(seed=1).make()
    assert not torch.equal(x1, x3)
    assert x1.shape == (16, 128)
    other = oom_scenario(batch_size=10, seed=3)
    assert other.budget_bytes == a.budget_bytes == budget_for()  # the same device
    assert a.budget_bytes % 2**20 == 0
    assert 0.45 < a.budget_bytes / a.estimate().peak_bytes <= 0.5


def test_the_estimate_is_the_measured_plain_step_and_activations_dominate():
    scenario = oom_scenario()
    model, optimizer, x, y = scenario.make()
    measured = measure_step(model, (x, y), optimizer)
    assert measured.peak_bytes == scenario.estimate().peak_bytes
    breakdown = measured.breakdown
    assert breakdown.dominant() == "activations"
    assert 0.6 < breakdown.activations / breakdown.total < 0.9


FITS = {  # step -> fits the budget
    "plain": (oom_scenario().plain_step, False),
    "bf16 autocast alone": (accumulate(micro=16, amp=True), False),
    "2 micro-batches": (accumulate(n_microbatches=2), False),
    "3 micro-batches": (accumulate(n_microbatches=3), True),
    "4 micro-batches": (accumulate(n_microbatches=4), True),
    "checkpointing": (accumulate(micro=16, checkpoint=True), True),
    "bf16 + 2 micro-batches": (accumulate(n_microbatches=2, amp=True), True),
}


@pytest.mark.parametrize("name", list(FITS))
def test_which_fixes_fit_the_budget(name):
    step, fits = FITS[name]
    scenario = oom_scenario()
    run = scenario.run(step)
    assert run.fitted == fits, str(run)
    if fits:
        assert len(run.losses) == 2 and run.peak_bytes <= 0.9 * scenario.budget_bytes, str(run)
    else:
        assert run.report.dominant == "activations" and "out of memory" in str(run)


# ----------------------------------------------------------------------------- A1


def _truth():
    scenario = oom_scenario()
    model, optimizer, x, y = scenario.make()
    b = measure_step(model, (x, y), optimizer).breakdown
    return scenario, b, b.activations / b.total, b.activations / (
        b.parameters + b.gradients + b.optimizer)


def test_check_diagnosis_passes_the_measured_answer():
    _, b, share, times = _truth()
    check_diagnosis("activations", share, times)
    check_diagnosis("activations", torch.tensor(share + 0.02), times * 1.04)


def test_check_diagnosis_teaches():
    scenario, b, share, times = _truth()
    full_states = scenario.estimate().model_states().total_bytes
    wrong = [
        (("optimizer", share, times), r"'optimizer': at the peak it held .* 'activations' held"),
        (("memory", share, times), "should be one of"),
        (("activations", share * 100, times), "not a percentage"),
        (("activations", b.activations / scenario.budget_bytes, times), "over the budget"),
        (("activations", 0.5, times), "divide the dominant category's bytes"),
        (("activations", "0.86", times), "should be a number"),
        (("activations", share, 1 / times), "the inverse"),
        (("activations", share, b.activations / full_states), "counted all the gradients"),
        (("activations", share, times / 2), "divide the dominant row"),
        ((None, None, None), r"still None: the answer cell raised NotImplementedError.*"
                             r"Replace `raise NotImplementedError\(\)` with your code"),
        (("activations", None, times), "DOMINANT_SHARE"),
    ]
    for args, message in wrong:
        with pytest.raises(AssertionError, match=message):
            check_diagnosis(*args)


def test_check_diagnosis_recognizes_the_oom_report_and_autocast():
    scenario = oom_scenario()
    report = scenario.run(scenario.plain_step, steps=1).report
    oom_share = report.live.activations / report.live.total
    model, optimizer, x, y = scenario.make()
    amp = measure_step(model, (x, y), optimizer, amp=True).breakdown
    amp_times = amp.activations / (amp.parameters + amp.gradients + amp.optimizer)
    _, _, share, times = _truth()
    assert abs(oom_share - share) > 0.06 and abs(amp_times / times - 1) > 0.2
    with pytest.raises(AssertionError, match="OOM report"):
        check_diagnosis("activations", oom_share, times)
    with pytest.raises(AssertionError, match="under autocast"):
        check_diagnosis("activations", share, amp_times)


# ----------------------------------------------------------------------------- A2


@pytest.mark.parametrize("fit_step", [
    accumulate(),  # micro-batches of 4 (13 -> 4+4+4+1), each weighted len / N
    accumulate(micro=16, checkpoint=True),  # the whole batch at once, Blocks checkpointed
    accumulate(n_microbatches=2, amp=True),  # bf16 autocast, 2 micro-batches
], ids=["accumulation", "checkpointing", "bf16+accumulation"])
def test_check_fit_step_passes_right_steps(fit_step):
    check_fit_step(fit_step)
    check_fit_step(fit_step, batch_size=13, seed=4)


WRONG = {
    "2 micro-batches do not fit": (accumulate(n_microbatches=2), 16,
                                   r"ran out of memory(.|\n)*activations(.|\n)*cheapest first"),
    "loss not divided": (accumulate(weight="none"), 16,
                         r"counts examples 0-15: 1/4;.*4 times the batch's gradient"),
    "divided by k, unequal micro-batches": (accumulate(n_microbatches=3, weight="k"), 16,
                                            "examples 0-5: 1/18, examples 6-15: 1/15.*divided "
                                            "by k"),
    "lesson's recipe, B=13": (lesson_accumulation, 13, "examples 0-11: 1/16, example 12: 1/4"),
    "half the batch": (accumulate(take_half=True), 16, "examples 8-15: 0.*Some examples are "
                                                       "missing"),
    "zeroed in the loop": (accumulate(zero="inside"), 16, "Only the last micro-batch is left"),
    "zeroed after the step": (accumulate(zero="after"), 16, "no gradients were left in .grad"),
    "never zeroed": (accumulate(zero="never"), 16, "include the previous step's"),
    "a step per micro-batch": (accumulate(step="each"), 16, "optimizer.step.. ran 4 times"),
    "no step": (accumulate(step="never"), 16, "did not step: call optimizer.step"),
    "its own optimizer": (own_optimizer, 16, "yet the parameters moved"),
    "attached loss": (accumulate(detach=False), 16, "still attached to the autograd graph"),
    "forward under no_grad": (forward_without_grad, 16, "raised RuntimeError(.|\n)*do not "
                                                             "detach it"),
    "not a function": ("fit_step", 16, "is not a function"),
    "gpulab's own": (oom_scenario().plain_step, 16, "gpulab's"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_check_fit_step_teaches(name):
    fit_step, batch_size, message = WRONG[name]
    with pytest.raises(AssertionError, match=message):
        check_fit_step(fit_step, batch_size=batch_size, seed=2)


def test_lesson_recipe_passes_when_the_batch_divides():
    check_fit_step(lesson_accumulation)  # 16 = 4 x 4: dividing by k is right here


def test_check_fit_step_compares_the_loss():
    def sum_of_losses(model, optimizer, x, y):
        accumulate()(model, optimizer, x, y)
        return 4 * math.log(64)

    with pytest.raises(AssertionError, match="times the mean"):
        check_fit_step(sum_of_losses)


def test_check_fit_step_reads_the_peak_itself_when_the_budget_is_lifted():
    def lift_the_budget(model, optimizer, x, y):
        for obj in gc.get_objects():  # the checker's tracker lives in this process
            if isinstance(obj, MemoryTracker):
                obj.budget_bytes = 1 << 40
        return oom_scenario().plain_step(model, optimizer, x, y)

    with pytest.raises(AssertionError, match="over the .* budget, yet no out-of-memory error"):
        check_fit_step(lift_the_budget)


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake):
    """Each mistake that tests/grading_specs.py knows (tests/grading_checks.py grades some end to
    end): the solution with that mistake, run here up to its test cell, fails there, visible
    and hidden tests included, with the teaching message."""
    SPEC.expect_checker_teaches(mistake)
