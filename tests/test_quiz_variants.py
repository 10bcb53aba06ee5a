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
from gpulab.cloud_cost import max_checkpoint_interval
from gpulab.hardware import get_gpu
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
        "q02": {"gpu": "H100 PCIe", "rows": 8192, "hidden": 8192},
        "q03": {"nodes": 4, "preemptions_per_node_hour": 0.01, "restart_minutes": 5,
                "max_loss_percent": 4},
        "q04": {"stride": 4, "dtype": "float16"},
        "q13": {"n_bytes": 4e9, "world_size": 8, "alpha": 5e-6, "beta": 100e9},
        "q14": {"n_bytes": 4e9, "world_size": 4, "seconds": 0.02},
        "q15": {"gpu": "H100 SXM", "n_params": 20e9, "reserved_gb": 16},
        "q19": {"pp_size": 8, "batch": 32, "microbatch": 4, "n_chunks": 4},
        "q22": {"n_params": 8e9, "optimizer": "sgd-momentum"},
    }


def test_the_draw_reads_the_id_alone(monkeypatch):
    monkeypatch.setenv(HUB_USER, "grace")
    assert draw("ada").learner == "ada"  # the grader's way: no hub, no conflict
    with pytest.raises(LearnerError):
        draw("  ")


def test_every_combination_is_a_question_worth_asking():
    """Whatever the draw: the GPUs are on the spec sheet (with bf16 where the question computes
    in it), the spot job's interval is minutes long and its one node's rate gives a clearly longer
one, a count is at least 2, the ZeRO-2 job fits and ZeRO-3 would need fewer GPUs (so that
    stage's slip costs the points), and the bubble is a fraction above 1% (so that a percentage
    is refused by the range check)."""
    for numbers in every_draw("q02"):
        assert get_gpu(numbers.gpu).bf16 and 0 < EXPECTED["q02"](numbers) < 1e4
    for numbers in every_draw("q03"):
        one_node = 60 * max_checkpoint_interval(numbers.preemptions_per_node_hour,
                                                numbers.max_loss_percent / 100,
                                                numbers.restart_minutes / 60)
        assert 5 < EXPECTED["q03"](numbers) < one_node / 1.5, numbers
    for numbers in every_draw("q04"):
        assert 2 <= EXPECTED["q04"](numbers) <= 32, numbers
    for numbers in every_draw("q15"):
        zero2 = EXPECTED["q15"](numbers)
        budget = (get_gpu(numbers.gpu).memory_gb - numbers.reserved_gb) * 1e9
        zero3 = next(n for n in range(1, 4097) if model_states(
            numbers.n_params, "mixed", "adam", zero_stage=3, world_size=n).total_bytes <= budget)
        assert 2 <= zero3 < zero2 <= 64, numbers
    for numbers in every_draw("q19"):
        assert (numbers.batch // numbers.microbatch) % numbers.pp_size == 0, numbers
        assert 0.01 < EXPECTED["q19"](numbers) < 1, numbers
    for question in ("q13", "q14", "q22"):
        assert all(EXPECTED[question](numbers) > 0 for numbers in every_draw(question))


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
        "q13, ada's numbers:", "  n_bytes    = 4e+09", "  world_size = 8",
        "  alpha      = 5e-06", "  beta       = 1e+11"]
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
