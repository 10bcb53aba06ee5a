"""Lab 4 Part B1 and B3: count_transfers counts slow_train's syncs and copies as a GPU would make
them, on the cpu runner too; check_profile_reading passes a reading of the learner's own
profile of slow_train and fails, with the message that teaches, on the known wrong readings
(another phase, a share in percent, counts per micro-batch or over several steps, kilobytes), on
a profile of something else and on one a busy machine turned over; check_fast_technique passes a
right fast_train and fails the partial fixes (a sync every step, syncs every micro-batch, copies
every micro-batch, micro-batches kept, a wrong result), each of which keeps the points of the
other parts."""

import pytest
import torch
import torch.nn.functional as F
from test_checks_lab4_pipeline import (
    batch_order,
    failure_message,
    fast_summed,
    fast_train,
    standardized,
)

from gpulab.checks.harness.training import one_thread
from gpulab.checks.lab4 import (
    check_fast_results,
    check_fast_technique,
    check_profile_reading,
    check_speedup,
    expected_profile,
)
from gpulab.checks.lab4.profile_reading import SIGNATURE_OPS, slow_step
from gpulab.profiling import ProfileResult, Span, count_transfers, profile_steps
from gpulab.profiling.trace import OpCall
from gpulab.slow_pipeline import MICRO_BATCH_SIZE, pipeline_problem

pytestmark = pytest.mark.lab4

# slow_train's step: 8 micro-batches of 8 examples, each copied in as 64 float32 pixels and an
# int64 label, and read back 4 times (loss.item(), isfinite(...).item(), two .cpu()).
MICRO = 64 // MICRO_BATCH_SIZE
SLOW_BYTES = MICRO * MICRO_BATCH_SIZE * (64 * 4 + 8)
CALLS = {"data": 8.0, "forward": 8.0, "backward": 8.0, "optimizer": 1.0,
         "aten::select": 640.0, "aten::lift_fresh": 512.0, "aten::addmm": 16.0}
SHARES = {"data": 0.55, "forward": 0.15, "backward": 0.19, "optimizer": 0.02, "other": 0.09}
WANT = {"share_ranges": {k: [v - 0.03, v + 0.03] for k, v in SHARES.items()}, "calls": CALLS,
        "syncs": 4.0 * MICRO, "h2d_copies": 2.0 * MICRO, "h2d_bytes": float(SLOW_BYTES),
        "micro_batches": MICRO}


def made_profile(shares: dict = SHARES, calls: dict = CALLS, steps: int = 3) -> ProfileResult:
    """A profile whose steps take 1 s, split into `shares`, with `calls` per step: each phase in
    that many equal spans, each op that many times."""
    step_spans, phase_spans, ops = [], [], []
    for i in range(steps):
        t = float(i)
        step_spans.append(Span("ProfilerStep#1", t, t + 1.0))
        for name, share in shares.items():
            n = int(calls.get(name, 0))
            for k in range(n):
                start = t + k * share / n
                phase_spans.append(Span(name, start, start + share / n))
            t += share
        for name in SIGNATURE_OPS:
            ops += [OpCall(name, i + 0.5, i + 0.5, 0.0, 0.0, 0.0, 0)] * int(calls.get(name, 0))
    return ProfileResult(device="cpu", steps=step_spans, phase_spans=phase_spans, ops=ops)


PROFILE = made_profile()


def test_count_transfers_counts_slow_train_as_a_gpu_would():
    step, model = slow_step(pipeline_problem())
    counts = count_transfers(step, model, steps=2)
    assert (counts.syncs, counts.h2d_copies, counts.h2d_bytes) == (32, 16, SLOW_BYTES)
    assert counts.pageable_copies == counts.blocking_copies == 16
    assert "syncs" in str(counts)


def test_count_transfers_reads_return_host_copies_and_dtype_changes_are_no_copies():
    model = torch.nn.Linear(3, 2)

    def step():
        x = torch.ones(4, 3).to(torch.float64).to("cpu", non_blocking=True)  # one copy in
        y = model(x.float())
        host = y.cpu()  # a sync; a GPU returns a host copy, so `host` is not the device's
        int(host.sum())  # on the host: no sync
        y.sum().item()  # a sync

    counts = count_transfers(step, model, steps=1)
    assert (counts.syncs, counts.h2d_copies, counts.blocking_copies) == (2, 1, 0)
    assert counts.h2d_bytes == 4 * 3 * 8


def test_expected_profile_matches_the_lab_and_grades_a_real_profile():
    """The key's counts are the lab's, and a real profile of slow_train (with other step counts
    than the key's) passes with its own reading and fails one of another phase."""
    want = expected_profile()
    assert (want["syncs"], want["h2d_copies"], want["h2d_bytes"]) == (32, 16, SLOW_BYTES)
    assert want["calls"] == CALLS, "the lab's step: 8 micro-batches of 8 examples"
    assert all(0 <= low <= high < 1 for low, high in want["share_ranges"].values())
    step, _ = slow_step(pipeline_problem())
    with one_thread():  # as in a grading kernel: two threads beside another worker fight
        profile = profile_steps(step, steps=2, warmup=1)
    shares = profile.phases().shares()
    largest = max(shares, key=shares.get)
    check_profile_reading(largest, shares[largest], 32, SLOW_BYTES, profile, want=want)
    other = min(shares, key=shares.get)
    with pytest.raises(AssertionError, match="take the phase with the largest time"):
        check_profile_reading(other, shares[other], 32, SLOW_BYTES, profile, want=want)


def test_the_share_is_read_from_the_learners_own_profile():
    """A busy machine moved the learner's profile away from the grader's runs: their reading of
    it passes, and the same number read from the grader's profile does not."""
    busy = made_profile({**SHARES, "data": 0.72, "backward": 0.02})
    check_profile_reading("data", 0.72, 32.0, SLOW_BYTES, busy, want=WANT)
    check_profile_reading("data", 0.71, 32, SLOW_BYTES, busy, want=WANT)  # read to 2 digits
    with pytest.raises(AssertionError, match=r"PHASE_SHARE = 0.55: divide .* Your profile "
                                             r"gives 0.720 for 'data'"):
        check_profile_reading("data", 0.55, 32, SLOW_BYTES, busy, want=WANT)


def test_a_profile_far_from_the_graders_asks_for_a_quiet_machine():
    """PyTorch's threads fighting for 2 busy cores turned the profile over ('data' 10% of the
    step); read faithfully, it is still not slow_train's profile on a machine of its own."""
    fought = made_profile({"data": 0.10, "forward": 0.46, "backward": 0.37, "optimizer": 0.01,
                           "other": 0.06})
    with pytest.raises(AssertionError, match=r"^Run the profiling cell again on a quiet "
                                             r"machine.*'forward' took 46%.*12% to 18%"):
        check_profile_reading("forward", 0.46, 32, SLOW_BYTES, fought, want=WANT)
    with pytest.raises(AssertionError, match=r"^Run the profiling cell again on a quiet"):
        check_profile_reading("data", 0.62, 32, SLOW_BYTES, fought, want=WANT)  # the key's


@pytest.mark.parametrize("profile, expected", [
    (None, r"^Run the profiling cell above .* `profile` is a NoneType"),
    (SHARES, "`profile` is a dict, not what profile_steps returns"),
    (made_profile(calls={**CALLS, "backward": 1.0}),
     r"^Profile slow_train's step as the profiling cell above does, one step per call: "
     r"in `profile`, 'backward' ran 1 times a step, and 8 times"),
    (made_profile(calls={**CALLS, "aten::select": 1280.0}), "'aten::select' ran 1280 times"),
])
def test_a_profile_of_something_else_is_refused_with_what_to_run(profile, expected):
    with pytest.raises(AssertionError, match=expected):
        check_profile_reading("data", 0.55, 32, SLOW_BYTES, profile, want=WANT)


def test_a_phase_close_to_the_largest_counts_as_it():
    close = made_profile({**SHARES, "data": 0.36, "backward": 0.35, "forward": 0.12})
    check_profile_reading("backward", 0.35, 32, SLOW_BYTES, close, want=WANT)


@pytest.mark.parametrize("answers, expected", [
    ((None, None, None, None), "still None"),
    (("model", 0.55, 32, SLOW_BYTES), r"one of \('data', 'forward'"),
    (("backward", 0.19, 32, SLOW_BYTES), r"^DOMINANT_PHASE = 'backward': take the phase .* "
                                         r"'backward' took 19% .* 'data' took 55%"),
    (("data", 55, 32, SLOW_BYTES), r"^PHASE_SHARE = 55: a share is a fraction .* not a "
                                   r"percentage"),
    (("data", 0.15, 32, SLOW_BYTES), r"^PHASE_SHARE = 0.15: divide the phase's time per step"),
    (("data", 0.55, 4, SLOW_BYTES), "that is per micro-batch"),
    (("data", 0.55, 160, SLOW_BYTES), "the total over 5 steps"),
    (("data", 0.55, "32", SLOW_BYTES), "should be a number"),
    (("data", 0.55, 32, SLOW_BYTES / MICRO), "that is per micro-batch"),
    (("data", 0.55, 32, SLOW_BYTES / 1000), "in kilobytes"),
    (("data", 0.55, 32, MICRO * MICRO_BATCH_SIZE * 64 * 4), "read the bytes copied row"),
])
def test_wrong_reading_fails_with_its_message(answers, expected):
    with pytest.raises(AssertionError, match=expected):
        check_profile_reading(*answers, PROFILE, want=WANT)


# ----------------------------------------------------------------------------- B3: technique


def _fast(model, optimizer, images, labels, *, steps, batch_size, seed, read="end",
          copy="once", micro=False):
    """fast_train, or one of its partial fixes: read the loss every step or every micro-batch,
    copy every micro-batch to the device, run the model on micro-batches."""
    device = next(model.parameters()).device
    x_all, y_all = standardized(images), labels
    if copy == "once":
        x_all, y_all = x_all.to(device), y_all.to(device)
    losses = []
    for idx in batch_order(len(labels), steps, batch_size, seed):
        if copy == "once":
            x, y = x_all[idx], y_all[idx]
        else:  # micro-batch by micro-batch, as slow_train does
            parts = [(x_all[i].to(device), y_all[i].to(device)) for i in idx.split(8)]
            x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        if micro:  # slow_train's micro-batches, each mean weighted by its share of the batch
            loss = sum(F.cross_entropy(model(xs), ys) * (len(ys) / len(y))
                       for xs, ys in zip(x.split(MICRO_BATCH_SIZE), y.split(MICRO_BATCH_SIZE),
                                         strict=True))
        else:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if read == "micro_batch":
            for _ in range(MICRO):
                torch.isfinite(loss).item()
        losses.append(loss.item() if read in ("step", "micro_batch") else loss.detach())
    return [float(v) for v in losses] if read != "end" else torch.stack(losses).tolist()


def fast_item_per_step(*args, **kwargs):
    return _fast(*args, **kwargs, read="step")


def fast_syncs_per_micro_batch(*args, **kwargs):
    return _fast(*args, **kwargs, read="micro_batch")


def fast_copies_per_micro_batch(*args, **kwargs):
    return _fast(*args, **kwargs, copy="micro_batch")


def fast_micro_batches(*args, **kwargs):
    return _fast(*args, **kwargs, micro=True)


def test_right_fast_train_passes_technique():
    check_fast_technique(fast_train)
    check_fast_technique(_fast, seed=9, steps=30)


@pytest.mark.parametrize("partial, expected", [
    (fast_item_per_step, "fast_train made 1.00 host-device syncs a step"),
    (fast_syncs_per_micro_batch, "fast_train made 9.00 host-device syncs a step"),
    (fast_copies_per_micro_batch, "copied to the device 16.00 times a step"),
    (fast_micro_batches, "fast_train ran the model 8.00 times a step (slow_train 8): "
                         "micro-batches"),
    (fast_summed, "does not give slow_train's losses"),
])
def test_partial_fix_fails_technique_with_its_message(partial, expected):
    assert expected in failure_message(check_fast_technique, partial)


def test_a_partial_fix_loses_only_the_technique():
    """A sync every step costs a CPU nearly nothing: the results and the speed-up still pass."""
    check_fast_results(fast_item_per_step)
    check_speedup(fast_item_per_step)
    check_fast_results(fast_micro_batches)
