"""Each learner's numbers for the quiz (gpulab/quiz/variant.py): drawn from the id alone, the
same everywhere, worth asking whatever the draw, named by the questions' text, and different
enough that two learners' answer sheets are not interchangeable; and `python -m gpulab.quiz
variant STUDENT`, the instructor's view of them. The notebook run with them is tested in
tests/test_quiz.py, grading by a learner's id in tests/test_grading_quiz.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import subprocess
import sys

import pytest
from lab_submissions import ROOT, cell_by_grade_id, read

from gpulab.checks.keys import all_answers
from gpulab.checks.quiz import ANSWERS, ASSIGNMENT, CHOICE
from gpulab.checks.quiz.expected import EXPECTED
from gpulab.cloud_cost import preemption_loss_fraction
from gpulab.distributed.cost_model import busbw, ring_all_reduce_time
from gpulab.distributed.schedule import schedule_interleaved_1f1b
from gpulab.hardware import get_gpu, ops_per_byte
from gpulab.memory.recipes import model_states
from gpulab.quiz import LearnerError, Variant, draw, learner_id, variant
from gpulab.quiz.__main__ import main
from gpulab.quiz.variant import HUB_USER

pytestmark = pytest.mark.quiz

SOLUTION = ROOT / "solutions" / "quiz" / "quiz.ipynb"
NUMERIC = [q for q in ASSIGNMENT.points if q not in CHOICE]
LEARNERS = [f"learner{i:02d}" for i in range(40)]


def every_draw(question: str):
    """Every combination of `question`'s choices, as its numbers."""
    kind = Variant.questions()[question]
    names = [f.name for f in dataclasses.fields(kind)]
    options = [f.metadata["choices"] for f in dataclasses.fields(kind)]
    return [kind(**dict(zip(names, combination, strict=True)))
            for combination in itertools.product(*options)]


# ----------------------------------------------------------------------------- the draw


def test_the_numeric_questions_are_the_ones_with_numbers_and_answers():
    assert list(Variant.questions()) == NUMERIC == list(ANSWERS) == list(EXPECTED)


def test_a_learners_numbers_never_change():
    """The grader draws them again from the id the notebook was handed in under, maybe weeks and
    a gpulab release later: changing SALT or a list of choices changes every learner's numbers,
    so it waits for a new class (and this test says so)."""
    mine = draw("ada")
    assert draw("ada") == mine and draw("  ada ") == mine
    assert dataclasses.asdict(mine) == {
        "learner": "ada",
        "q02": {"gpu": "L4", "hidden": 8192},
        "q03": {"preemptions_per_node_hour": 0.01, "checkpoint_minutes": 45,
                "restart_minutes": 7, "max_loss_percent": 5},
        "q04": {"stride": 5, "dtype": "float16"},
        "q13": {"n_bytes": 500e6, "world_size": 32, "alpha": 20e-6, "budget_ms": 15},
        "q14": {"algbw_gbps": 40, "world_size": 4, "other_world_size": 2},
        "q15": {"gpu": "H200", "world_size": 64, "reserved_gb": 16},
        "q19": {"pp_size": 8, "n_chunks": 4, "max_bubble_percent": 5},
        "q22": {"gpu": "A100 40GB SXM", "reserved_gb": 8, "optimizer": "adamw"},
    }


def test_the_draw_reads_the_id_alone(monkeypatch):
    monkeypatch.setenv(HUB_USER, "grace")
    assert draw("ada").learner == "ada"  # the grader's way: no hub, no conflict
    with pytest.raises(LearnerError):
        draw("  ")


def _far_from_whole(x: float, margin: float = 0.01) -> bool:
    """`x` is at least `margin` from every whole number: rounding it is not a coin toss."""
    return margin <= x - math.floor(x) <= 1 - margin


def test_every_combination_is_a_question_worth_asking():
    """Whatever the draw: the GPUs are on the spec sheet (with bf16 where the question computes
    in it); each threshold a count is rounded from lies at least 1% away from a whole number,
    so a learner's float arithmetic cannot flip the count; a count is at least 2; and the
    all-reduce's latency term spends at least 3% of the budget and at most 70% (so leaving it
    out costs the points, and the budget is reachable)."""
    for numbers in every_draw("q02"):
        ridge = ops_per_byte(numbers.gpu, "bf16")
        h, o = numbers.hidden, 4 * numbers.hidden
        assert get_gpu(numbers.gpu).bf16 and h * o > ridge * (h + o), numbers
        assert _far_from_whole(ridge * h * o / (h * o - ridge * (h + o))), numbers
    for numbers in every_draw("q03"):
        per_node = numbers.preemptions_per_node_hour * (numbers.checkpoint_minutes / 2
                                                        + numbers.restart_minutes) / 60
        assert _far_from_whole(numbers.max_loss_percent / 100 / per_node), numbers
        assert EXPECTED["q03"](numbers) >= 2, numbers
    for numbers in every_draw("q04"):
        assert 2 <= EXPECTED["q04"](numbers) <= 32, numbers
    for numbers in every_draw("q13"):
        latency = 2 * (numbers.world_size - 1) * numbers.alpha
        assert 0.03 <= latency / (numbers.budget_ms / 1e3) <= 0.7, numbers
    for numbers in every_draw("q19"):
        p, bound = numbers.pp_size, numbers.max_bubble_percent / 100
        assert _far_from_whole((p - 1) * (1 - bound) / (bound * numbers.n_chunks)), numbers
    for question in ("q14", "q15", "q22"):
        assert all(EXPECTED[question](numbers) > 0 for numbers in every_draw(question))


def test_each_expected_answer_is_what_the_lessons_formulas_give():
    """The grader's answers (searches over, and combinations of, the course's functions) equal
    the closed forms a learner derives, for every draw: the key and the question agree."""
    for numbers in every_draw("q02"):
        ridge = ops_per_byte(numbers.gpu, "bf16")
        h = numbers.hidden
        assert EXPECTED["q02"](numbers) == math.ceil(4 * h * ridge / (4 * h - 5 * ridge))
    for numbers in every_draw("q03"):
        nodes = EXPECTED["q03"](numbers)
        loss = [preemption_loss_fraction(n * numbers.preemptions_per_node_hour,
                                         numbers.checkpoint_minutes / 60,
                                         numbers.restart_minutes / 60) for n in (nodes, nodes + 1)]
        assert loss[0] <= numbers.max_loss_percent / 100 < loss[1], numbers
    for numbers in every_draw("q13"):
        beta = EXPECTED["q13"](numbers) * 1e9
        took = ring_all_reduce_time(numbers.n_bytes, numbers.world_size, numbers.alpha, beta)
        assert math.isclose(took, numbers.budget_ms / 1e3, rel_tol=1e-12), numbers
    for numbers in every_draw("q14"):
        there = EXPECTED["q14"](numbers)
        assert math.isclose(busbw("all_reduce", there, numbers.other_world_size),
                            busbw("all_reduce", numbers.algbw_gbps, numbers.world_size)), numbers
    for numbers in every_draw("q15"):
        n_params = EXPECTED["q15"](numbers) * 1e9
        budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9
        def zero2(n, numbers=numbers):
            return model_states(n, "mixed", "adam", zero_stage=2,
                                world_size=numbers.world_size).total_bytes
        assert zero2(0.999 * n_params) <= budget < zero2(1.001 * n_params), numbers
    for numbers in every_draw("q22"):
        n_params = EXPECTED["q22"](numbers) * 1e9
        budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9
        def states(n, numbers=numbers):
            return model_states(n, "bf16", numbers.optimizer).total_bytes
        assert states(0.999 * n_params) <= budget < states(1.001 * n_params), numbers


def test_the_fewest_microbatches_are_what_the_simulated_schedule_needs():
    """q19's key comes from the uniform-cost formula; the simulated interleaved schedule (what
    Lesson 06 draws) agrees: its bubble is within the bound at the answer, above it one round
    of pp_size earlier."""
    for numbers in every_draw("q19"):
        m, p = EXPECTED["q19"](numbers), numbers.pp_size
        bound = numbers.max_bubble_percent / 100
        assert m % p == 0, numbers
        bubble = schedule_interleaved_1f1b(p, m, numbers.n_chunks).bubble_fraction
        assert bubble <= bound, numbers
        if m > p:
            earlier = schedule_interleaved_1f1b(p, m - p, numbers.n_chunks).bubble_fraction
            assert earlier > bound, numbers


def test_two_learners_answer_sheets_are_not_interchangeable():
    """Pairs of 40 learners: none share every numeric answer (within the grader's 1%), and on
    average they share fewer than a quarter of them (a multiple choice is the same for all)."""
    answers = {learner: all_answers("quiz", learner) for learner in LEARNERS}
    shared = [sum(math.isclose(answers[a][k], answers[b][k], rel_tol=0.01) for k in answers[a])
              for a, b in itertools.combinations(LEARNERS, 2)]
    assert max(shared) < len(NUMERIC)
    assert sum(shared) / len(shared) < len(NUMERIC) / 4


# ----------------------------------------------------------------------------- whose notebook


def test_the_learner_is_learner_or_else_the_hub_user(monkeypatch):
    monkeypatch.delenv(HUB_USER, raising=False)
    assert learner_id(" ada ") == "ada"
    monkeypatch.setenv(HUB_USER, "ada")
    assert learner_id("") == learner_id("ada") == "ada"
    assert variant("").learner == "ada"


@pytest.mark.parametrize("hub, written, message", [
    (None, "", r'Write your student id in the cell above, LEARNER = "<your id>"'),
    ("grace", "ada", r'LEARNER = "ada", but you are signed in to JupyterHub as "grace"\..*set '
                     r'LEARNER = "" \(or "grace"\)'),
    (None, 42, r'LEARNER must be your id in quotes, such as LEARNER = "ada", not a int'),
])
def test_an_unclear_learner_is_refused_with_what_to_do(monkeypatch, hub, written, message):
    if hub is None:
        monkeypatch.delenv(HUB_USER, raising=False)
    else:
        monkeypatch.setenv(HUB_USER, hub)
    with pytest.raises(LearnerError, match=message):
        variant(written)


# ----------------------------------------------------------------------------- the notebook


def test_each_numeric_question_names_its_numbers_and_prints_them():
    """The question's text names every field of its numbers (`gpu`), and the cell under it
    prints them: text and numbers stay in step."""
    nb = read(SOLUTION)
    for question, kind in Variant.questions().items():
        text = cell_by_grade_id(nb, f"{question}_question").source
        missing = [f.name for f in dataclasses.fields(kind)
                   if not re.search(rf"`[^`]*\b{f.name}\b[^`]*`", text)]
        assert not missing, f"{question}'s text does not name {missing}"
        shown = cell_by_grade_id(nb, f"{question}_numbers").source
        assert shown.startswith(f'mine.show("{question}")'), shown


def test_show_prints_a_questions_numbers(capsys):
    draw("ada").show("q13")
    assert capsys.readouterr().out.splitlines() == [
        "q13, ada's numbers:", "  n_bytes    = 5e+08", "  world_size = 32",
        "  alpha      = 2e-05", "  budget_ms  = 15"]
    with pytest.raises(ValueError, match="'q01' has no numbers of its own"):
        draw("ada").show("q01")


# ----------------------------------------------------------------------------- the instructor


def test_the_instructor_sees_a_learners_numbers_and_expected_answers(capsys):
    assert main(["variant", "grace"]) == 0
    out = capsys.readouterr().out
    mine, answers = draw("grace"), all_answers("quiz", "grace")
    for question in NUMERIC:
        assert mine.describe(question) in out
    expected = [float(x) for x in re.findall(r"expected answer: (\S+)", out)]
    assert len(expected) == len(NUMERIC)
    for got, (name, want) in zip(expected, answers.items(), strict=True):
        assert math.isclose(got, want, rel_tol=1e-5), name


@pytest.mark.slow
def test_the_command_runs_as_the_guide_writes_it():
    done = subprocess.run([sys.executable, "-m", "gpulab.quiz", "variant", "ada"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "The quiz's numbers and expected answers for learner 'ada':" in done.stdout
    assert "q22, ada's numbers:" in done.stdout
