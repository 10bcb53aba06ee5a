"""Expected answers fixed outside the learner's kernel (autograder/answers.py, checks/keys.py).

The grader computes a lab's answers in a process of its own and writes each `answer_key("name")`
of a test cell as the value itself before the cell reaches the kernel, for the student who
handed the notebook in. Here: the rewriting on its own, the command against the library's own
computation (per student where answers differ per learner), and every answer the course's test
cells name being one the command computes.
"""

from __future__ import annotations

import json
import os

import pytest
from lab_submissions import ROOT, read

from autograder.answers import ANSWER_CALL, compute_answers, fill_in, uses_answers
from gpulab.checks import PACKAGES
from gpulab.checks.keys import all_answers, answer_key, main

LABS_WITH_ANSWERS = ("lab1_cuda_kernels", "lab3_ddp_from_scratch", "lab4_memory_and_profiling",
                     "lab5_parallelism_across_nodes", "quiz", "capstone_distributed_gpt")


def source(lab: str):
    return ROOT / "solutions" / lab


def test_a_call_becomes_its_value_and_the_rest_of_the_cell_stays():
    cell = ('"""q02 (2 points)"""  # é: offsets are bytes, not characters\n'
            'check(q02, want=answer_key("quiz.q02"), unit="µs")\n'
            'other = answer_key(\n    "lab1.waves",\n)["slots"]\n')
    filled = fill_in(cell, {"quiz.q02": 3.25, "lab1.waves": {"slots": 432}})
    assert filled == ('"""q02 (2 points)"""  # é: offsets are bytes, not characters\n'
                      'check(q02, want=(3.25), unit="µs")\n'
                      "other = ({'slots': 432})[\"slots\"]\n")
    namespace = {"check": lambda *args, **kwargs: None, "q02": 3.25}
    exec(filled, namespace)
    assert namespace["other"] == 432


def test_an_answer_the_grader_lacks_fails_the_test_instead_of_computing_it_in_the_kernel():
    filled = fill_in('want = answer_key("quiz.q99")\n', {})
    assert ANSWER_CALL not in filled
    with pytest.raises(LookupError, match="no expected answer 'quiz.q99'"):
        exec(filled, {})


def test_a_call_naming_a_learner_becomes_the_graded_students_value():
    """Whatever the notebook says about whose it is: the grader's answers are the student's."""
    filled = fill_in('grade(q02, answer_key("quiz.q02", mine.learner))\n', {"quiz.q02": 80.5})
    assert filled == "grade(q02, (80.5))\n"


def test_cells_without_answers_or_not_python_are_left_alone():
    for cell in ('check_saxpy(saxpy, sizes=[8])\n', 'x = answer_key(name)\n', '%time f(\n',
                 'answer_key("a", default=1)\n'):
        assert fill_in(cell, {"a": 1}) == cell


@pytest.mark.parametrize("lab", sorted(PACKAGES))
def test_every_answer_a_test_cell_names_is_computed(lab):
    names = set()
    for cell in read(source(lab) / f"{lab}.ipynb").cells:
        if cell.cell_type == "code" and ANSWER_CALL in cell.source:
            names |= {part.split('"')[1] for part in cell.source.split(f"{ANSWER_CALL}(")[1:]}
    assert uses_answers(source(lab)) == bool(names) == (lab in LABS_WITH_ANSWERS)
    if names:  # computed in this process; the grader's subprocess is checked below
        lacks = "a test cell names an answer its package lacks"
        assert names == set(all_answers(lab, "ada")), lacks


def test_the_quizs_answers_differ_per_learner_and_the_labs_do_not():
    assert all_answers("quiz", "ada") != all_answers("quiz", "grace")
    with pytest.raises(ValueError, match="quiz.q02 differs per learner"):
        answer_key("quiz.q02")
    assert all_answers("lab1_cuda_kernels") == all_answers("lab1_cuda_kernels", "ada")


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["quiz", "lab1_cuda_kernels"])
def test_the_graders_command_computes_what_the_library_does(lab):
    env = {**os.environ, "GPULAB_RUNNER": "cpu"}
    answers = compute_answers(lab, source(lab), env, ["ada", "grace"])
    assert answers == {student: all_answers(lab, student) for student in ("ada", "grace")}
    assert answers["ada"] == {name: answer_key(name, "ada") for name in answers["ada"]}
    assert compute_answers("lab2_amp_training", source("lab2_amp_training"), env, ["ada"]) == {
        "ada": {}}


def test_the_command_says_how_to_call_it(capsys):
    assert main(["lab9"]) == 2
    assert "usage: python -m gpulab.checks.keys" in capsys.readouterr().err
    assert main(["quiz"]) == 2
    assert "quiz.q02 differs per learner: say whose (--student ID)" in capsys.readouterr().err


def test_the_command_gives_each_student_their_answers(capsys):
    assert main(["quiz", "--student", "ada", "--student", "grace"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found == {"ada": all_answers("quiz", "ada"), "grace": all_answers("quiz", "grace")}


def test_the_waves_answer_is_the_course_spec_sheets_whatever_the_kernel_holds():
    """The attack that once earned Lab 1's Part 6: its GPU (now an L4) edited to 250 SMs in this
    process. The grader's answer comes from a fresh process, so it still says 58 SMs."""
    from gpulab.hardware import get_gpu

    env = {**os.environ, "GPULAB_RUNNER": "cpu"}
    l4 = get_gpu("L4")
    object.__setattr__(l4, "sms", 250)
    try:
        assert answer_key("lab1.waves")["fewest_waves"] == 3  # this process is fooled
        fresh = compute_answers("lab1_cuda_kernels", source("lab1_cuda_kernels"), env,
                                ["ada"])["ada"]
    finally:
        object.__setattr__(l4, "sms", 58)
    assert fresh["lab1.waves"]["sms"] == 58 and fresh["lab1.waves"]["fewest_waves"] == 13
