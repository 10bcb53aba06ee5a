"""The capstone, distributed training of a GPT end to end (solutions/capstone_distributed_gpt/...):
its parts and points, and its checkers. Every part runs the learner's FSDP2 code on a 2-node x
2-process LocalCluster (common.py) against references the checkers compute themselves.

    check_sharded_training(shard_model, PLAN)                 Part 1  FSDP2 equals one process
    check_memory_plan(predict_memory, shard_model, PLAN)      Part 2  predicted against measured
    check_elastic_resume(shard_model, save_checkpoint, ...)   Part 3  kill, restart, resume
    check_preemption(shard_model, ..., handle_notice, PLAN)   Part 4  notice, save, requeue
    check_hang_diagnosis(diagnose_hang)                       Part 5  a planted hang, named
    written_answer                                            Part 6  graded by hand
"""

import dataclasses

from gpulab.checks.capstone.elastic_resume import check_elastic_resume
from gpulab.checks.capstone.hang_diagnosis import check_hang_diagnosis
from gpulab.checks.capstone.memory_plan import check_memory_plan, check_prediction_follows_plan
from gpulab.checks.capstone.preemption import check_preemption
from gpulab.checks.capstone.sharded_training import check_sharded_training
from gpulab.checks.table import Answer, Assignment, Check, part

ASSIGNMENT = Assignment("capstone_distributed_gpt", (
    part("sharded_training", 4, Check("check_sharded_training", ("shard_model", "PLAN"))),
    part("memory_plan", 3, Check("check_memory_plan", ("predict_memory", "shard_model", "PLAN"),
                                 {"course_config": Answer("capstone.config")})),
    part("elastic_resume", 4, Check("check_elastic_resume", ("shard_model", "save_checkpoint",
                                                             "load_checkpoint", "PLAN"))),
    part("preemption", 4, Check("check_preemption", ("shard_model", "save_checkpoint",
                                                     "load_checkpoint", "install_notice_handler",
                                                     "handle_notice", "PLAN"))),
    part("hang_diagnosis", 2, Check("check_hang_diagnosis", ("diagnose_hang",))),
), manual=(("written_answer", 3),))


def _course_config() -> dict:
    from gpulab.capstone import capstone_config

    return dataclasses.asdict(capstone_config(None, seed=0))


def _graded_hang(learner: str) -> dict:
    from gpulab.capstone.hang import hang_for

    return dataclasses.asdict(hang_for(learner, draw="graded"))


# Expected answers the grader computes outside the learner's kernel (gpulab/checks/keys.py):
# the model whose memory is measured and predicted is the course's, whatever the kernel holds;
# the hang planted for the hidden test is the one drawn for the student who handed it in.
ANSWERS = {"config": _course_config, "hang": _graded_hang}

__all__ = ["ANSWERS", "ASSIGNMENT", "check_elastic_resume", "check_hang_diagnosis",
           "check_memory_plan", "check_prediction_follows_plan", "check_preemption",
           "check_sharded_training"]
