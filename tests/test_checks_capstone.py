"""The capstone's checkers against known-wrong learner code (tests/capstone_code.py). Each
cluster launch costs 10-40 s, so the right answers are graded once, end to end, in
tests/test_grading_capstone.py; here each known mistake (tests/grading_specs.py: CAPSTONE) meets
its checker on the cluster, the training checker a mistake of its own, and every checker its
cheap refusals."""

import dataclasses

import pytest
import torch
from capstone_code import (
    blame_first_rank,
    blame_longest_wait,
    blame_where_the_skipper_waits,
    diagnose_hang,
    diagnose_hang_stub,
    load_checkpoint,
    predict_memory,
    save_checkpoint,
    shard_model,
    shard_model_stub,
    shard_root_only,
)
from grading_specs import CAPSTONE as SPEC

from gpulab.capstone import ParallelPlan
from gpulab.capstone.hang import COLLECTIVES, PlantedHang, hang_for, plant
from gpulab.checks.capstone import (
    check_elastic_resume,
    check_hang_diagnosis,
    check_memory_plan,
    check_prediction_follows_plan,
    check_sharded_training,
)
from gpulab.distributed.tp_dtensor import parallelize_block

pytestmark = [pytest.mark.capstone]
PLAN = ParallelPlan(dp_size=4, precision="bf16", budget_bytes=32 * 2**20)


def test_a_stub_is_refused_before_any_launch():
    with pytest.raises(AssertionError, match="raised NotImplementedError.*Replace `raise"):
        check_sharded_training(shard_model_stub, PLAN)


def test_a_stub_checkpoint_function_is_refused_before_any_launch():
    with pytest.raises(AssertionError, match="shard_model would have raised NotImplementedError"):
        check_elastic_resume(shard_model_stub, save_checkpoint, load_checkpoint, PLAN)


def test_a_prediction_that_ignores_the_plan_is_caught_without_a_launch():
    check_prediction_follows_plan(predict_memory, PLAN)
    with pytest.raises(AssertionError, match="with dp_size 4 instead of 2.*it must fall"):
        check_prediction_follows_plan(lambda config, plan: 8 * 2**20, PLAN)


def test_gpulab_functions_earn_nothing():
    with pytest.raises(AssertionError, match="gpulab's .*write your own"):
        check_sharded_training(parallelize_block, PLAN)


def test_a_plan_that_cannot_run_says_why():
    with pytest.raises(AssertionError, match="PLAN: .*but the cluster has 4 ranks"):
        check_sharded_training(shard_model, ParallelPlan(dp_size=2))
    with pytest.raises(AssertionError, match="make it a gpulab.capstone.ParallelPlan"):
        check_memory_plan(predict_memory, shard_model, {"dp_size": 4})


def test_a_prediction_that_is_not_a_number_is_refused_before_any_launch():
    with pytest.raises(AssertionError, match="return the predicted peak bytes"):
        check_memory_plan(lambda config, plan: "8 MiB", shard_model, PLAN)


@pytest.mark.dist
@pytest.mark.slow
def test_sharding_only_the_root_is_caught():
    with pytest.raises(AssertionError, match=r"Blocks \[0, 1, 2, 3\] are not FSDPModules"):
        check_sharded_training(shard_root_only, PLAN, steps=2)


@pytest.mark.dist
@pytest.mark.slow
def test_tensor_parallelism_inside_a_node_passes(capsys):
    """dp_size=2 across the nodes x tp_size=2 inside each: FSDP2 on the "dp" axis of a 2-D mesh
    around lesson 06's DTensor plan, and still the one-process losses."""
    check_sharded_training(shard_model, ParallelPlan(dp_size=2, tp_size=2), steps=2)
    assert "tp_size=2" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the hang


def test_each_learner_draws_a_hang_whose_first_listed_rank_is_never_the_cause():
    hangs = {learner: hang_for(learner) for learner in (f"student{i}" for i in range(200))}
    assert all(1 <= h.skipper < h.world_size for h in hangs.values())
    assert {h.missing for h in hangs.values()} == set(COLLECTIVES)
    assert len(set(hangs.values())) > 10
    assert hang_for("ada") != hang_for("ada", draw="graded")


def test_a_stub_diagnosis_is_refused_before_any_launch():
    with pytest.raises(AssertionError, match="diagnose_hang would have raised NotImplementedErr"):
        check_hang_diagnosis(diagnose_hang_stub)


@pytest.fixture(scope="module")
def planted_report():
    """One real hang for the checker's messages: rank 2 of 4 skips the all_reduce and waits in
    the barrier after it."""
    hang = PlantedHang(world_size=4, skipper=2, missing="all_reduce")
    return hang, plant(hang)


@pytest.mark.dist
def test_a_diagnosis_that_blames_a_waiting_rank_or_names_the_wrong_call_is_caught(
        planted_report, monkeypatch):
    hang, report = planted_report
    assert "rank 2: waiting in barrier" in report and "rank 0: waiting in all_reduce" in report
    monkeypatch.setattr("gpulab.checks.capstone.hang_diagnosis.plant", lambda planted: report)
    planted = dataclasses.asdict(hang)
    check_hang_diagnosis(diagnose_hang, planted)
    for blames in (blame_first_rank, blame_longest_wait):  # both name rank 0 here
        with pytest.raises(AssertionError, match="rank 0 is one of the ranks waiting in "
                           "all_reduce: it made the call .* not the one to blame"):
            check_hang_diagnosis(blames, planted)
    with pytest.raises(AssertionError, match="(?s)barrier is where rank 2 waits: it walked past "
                       "the call it skipped.*rank 3: waiting in all_reduce"):
        check_hang_diagnosis(blame_where_the_skipper_waits, planted)
    with pytest.raises(AssertionError, match=r"returned 'rank 2': return a \(rank, collective"):
        check_hang_diagnosis(lambda text: "rank 2", planted)


# ----------------------------------------------------------------------------- known mistakes


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("mistake", SPEC.mistakes, ids=lambda m: m.student_id)
def test_a_known_mistake_fails_its_test_cell_with_its_message(mistake):
    """Each mistake that tests/grading_specs.py knows: the solution with that mistake, run here
    up to its test cell, fails there, visible and hidden tests included, with the teaching
    message. Each starts one 2-node cluster; none is graded end to end."""
    threads = torch.get_num_threads()  # the notebook's imports cell sets one thread
    try:
        SPEC.expect_checker_teaches(mistake)
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the notice, judged
# The four mistakes of tests/grading_specs.py meet check_preemption on the cluster above; what
# the first and the requeued run can show besides is judged here from their records, no launch.


def _run(losses=range(6), notice=None, exit_codes=None, ranks=(), ok=False):
    from gpulab.capstone import CapstoneRun

    return CapstoneRun(ok, "", None, tuple(ranks), "loopback", "", "",
                       tuple((0, step, 5.0) for step in losses), notice, exit_codes or {})


def _notice(codes, exited_in_grace=True):
    from gpulab.distributed import NoticeReport

    return NoticeReport("node 1", "SIGTERM", 10.0, 20.0, (2, 3), codes, exited_in_grace, 1.5)


def _saves(step, digest=None, ended=2.0):
    digest = digest or {"model": "m", "optimizer": "o"}
    return [{"rank": r, "step": step, "began": 1.0, "ended": ended, "in_handler": False,
             "digest": digest} for r in range(4)]


def test_a_first_run_that_exits_without_the_requeue_code_is_told_the_code():
    from gpulab.checks.capstone.preemption import judge_notice

    saves = _saves(4) + _saves(6)
    assert judge_notice(_run(notice=_notice({2: 75, 3: 75})), saves, 1, 10.0) == 6
    with pytest.raises(AssertionError, match=r"with exit code 0\. Once the checkpoint is saved, "
                       r"exit with REQUEUE_EXIT_CODE \(75\)"):
        judge_notice(_run(notice=_notice({2: 0, 3: 0})), saves, 1, 10.0)
    with pytest.raises(AssertionError, match="killed by SIGTERM: no handler caught it"):
        judge_notice(_run(notice=_notice({2: -15, 3: -15})), saves, 1, 10.0)
    with pytest.raises(AssertionError, match="the run ended before the notice could be sent"):
        judge_notice(_run(ok=True), saves, 1, 10.0)


def test_a_requeued_run_that_resumes_early_or_loads_another_state_is_caught():
    from gpulab.checks.capstone.preemption import judge_resume

    saved = _saves(6)
    rank = {"rank": 0, "resumed_digest": {"model": "m", "optimizer": "o"}}
    reference = [5.0] * 8
    judge_resume(_run(ranks=[{**rank, "start_step": 6, "losses": [(5.0).hex()] * 2}], ok=True),
                 saved, 6, reference)
    with pytest.raises(AssertionError, match="resumed at step 4, but the first one had completed "
                       "6 steps and saved them at the notice: 2 steps lost"):
        judge_resume(_run(ranks=[{**rank, "start_step": 4, "losses": []}], ok=True), saved, 6,
                     reference)
    moments_lost = {**rank, "start_step": 6, "resumed_digest": {"model": "m", "optimizer": "x"}}
    with pytest.raises(AssertionError, match=r"rank 0: the AdamW state \(moments, step\) the "
                       "requeued run loaded differ"):
        judge_resume(_run(ranks=[moments_lost], ok=True), saved, 6, reference)
    drifted = {**rank, "start_step": 6, "losses": [(5.5).hex()] * 2}
    with pytest.raises(AssertionError, match="step 6 after the requeue: loss 5.5000"):
        judge_resume(_run(ranks=[drifted], ok=True), saved, 6, reference)
