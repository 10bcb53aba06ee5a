"""gpulab.hint: every graded part of every lab has three levels of hints, shown one per call,
kept beside its checkers, and asking never changes anything the grader reads."""

from __future__ import annotations

import pytest

import gpulab
import gpulab.checks
from gpulab.self_check import hints
from gpulab.self_check.hints import LEVELS, find_hints, hint, hints_of

# The quiz is an assessment: it asks for what the learner knows, and gives no hints.
LABS = tuple(name for name in gpulab.checks.PACKAGES if name != "quiz")


@pytest.mark.parametrize("lab", LABS)
def test_every_graded_part_has_three_levels_of_hints(lab):
    for part in gpulab.checks.assignment(lab).parts:
        _, levels = find_hints(lab, part.name)
        assert len(levels) == LEVELS, f"{lab} {part.name}: {len(levels)} levels"
        assert all(len(text.split()) >= 8 for text in levels), f"{lab} {part.name}: too short"
        assert len(set(levels)) == LEVELS, f"{lab} {part.name}: a level repeats another"


@pytest.mark.parametrize("lab", LABS)
def test_every_hint_is_for_a_graded_part(lab):
    names = {p.name for p in gpulab.checks.assignment(lab).parts}
    stale = [key for key in hints_of(lab)
             if key not in names and f"{key}_technique" not in names]
    assert not stale, f"{lab}: hints for parts it does not have: {stale}"


# The mechanism, on a table of its own: what a lab's hints say is tested above.
TABLE = {"transpose": ("The idea, in a sentence or two of plain words for the learner.",
                       "The layout: which thread touches which cell, said in words.",
                       "The arithmetic: the shape of the index expressions, in words.")}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(hints, "hints_of", lambda lab: TABLE)


def test_each_call_shows_the_next_level_then_stays_on_the_last(table, tmp_path, capsys):
    shown = []
    for _ in range(LEVELS + 1):
        hint("lab1", "transpose", seen_file=tmp_path / "seen.json")
        shown.append(capsys.readouterr().out)
    for level in range(1, LEVELS + 1):
        assert f"hint {level} of {LEVELS}" in shown[level - 1]
        assert TABLE["transpose"][level - 1] in shown[level - 1]
    assert f"hint {LEVELS} of {LEVELS}" in shown[-1] and "last hint" in shown[-1]


def test_a_level_can_be_reprinted_without_moving_on(table, tmp_path, capsys):
    seen = tmp_path / "seen.json"
    hint("lab1", "transpose", level=2, seen_file=seen)
    hint("lab1", "transpose", level=1, seen_file=seen)
    capsys.readouterr()
    hint("lab1", "transpose", seen_file=seen)  # the next after the furthest seen
    assert f"hint 3 of {LEVELS}" in capsys.readouterr().out


def test_a_technique_part_and_a_grade_id_find_their_task_hints(table):
    assert find_hints("lab1", "test_transpose_technique") == ("transpose", TABLE["transpose"])


def test_an_unwritable_state_folder_still_gives_a_hint(table, tmp_path, capsys):
    blocker = tmp_path / "a-file"  # its "folder" cannot be made, even by root
    blocker.write_text("")
    hint("lab1", "transpose", seen_file=blocker / "seen.json")
    hint("lab1", "transpose", seen_file=blocker / "seen.json")
    assert capsys.readouterr().out.count("hint 1 of") == 2


def test_asking_badly_says_what_to_ask(table):
    with pytest.raises(ValueError, match="has no hints for 'nope': ask for one of transpose"):
        hint("lab1", "nope")
    with pytest.raises(ValueError, match="level must be 1 to 3"):
        hint("lab1", "transpose", level=4)
    with pytest.raises(ValueError, match="no lab 'lab9'"):
        hint("lab9", "x")


def test_the_quiz_gives_no_hints():
    with pytest.raises(ValueError, match="quiz is an assessment: it gives no hints"):
        hint("quiz", "q01")


def test_without_a_part_it_lists_the_parts(table, capsys):
    hint("lab1")
    out = capsys.readouterr().out
    assert "transpose" in out and "gpulab.hint('lab1', PART)" in out


def test_gpulab_hint_is_the_same_function():
    assert gpulab.hint is hint


def test_the_state_folder_follows_its_variable(tmp_path):
    from gpulab.env import state_dir

    assert state_dir({"GPULAB_STATE_DIR": str(tmp_path)}) == tmp_path
    assert state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "gpulab"
