"""Every lesson and lab solution states how long it runs, in the one form `make bench` reads
(benchmarks/bench_notebooks.py), and the benchmark's silence watch sees a cell that works
without printing. No run time is asserted here: the benchmark compares, on a quiet machine.

Every lesson also marks each section core or deep dive with its reading time, which must stay
near what its text estimates, and its first cell states the sums: the core path and everything
(docs/notebook-times.md)."""

import sys

import nbformat
import pytest
from lab_submissions import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_notebooks import (  # noqa: E402
    EXERCISE_MIN,
    NOTEBOOKS,
    PROSE_WORDS_PER_MIN,
    budget_s,
    execute,
    reading_minutes,
    sections,
    stated_reading,
    stated_time,
)

LESSONS = [rel for rel in NOTEBOOKS if rel.startswith("lessons/")]
CORE_PATH_MAX_MIN = 90  # the course's plan: 60-90 minutes of core path per lesson


def to_five(minutes: float) -> int:
    """Minutes as a first cell states them: to the nearest 5."""
    return 5 * round(minutes / 5)


@pytest.mark.parametrize("rel", NOTEBOOKS)
def test_every_notebook_states_its_run_time(rel):
    how, minutes = stated_time(ROOT / rel)
    assert how in ("about", "under") and 0 < minutes <= 10, (rel, how, minutes)


def test_every_lesson_and_lab_is_measured():
    measured = set(NOTEBOOKS)
    lessons = {str(p.relative_to(ROOT)) for p in (ROOT / "lessons").glob("*.ipynb")}
    labs = {str(p.relative_to(ROOT)) for p in (ROOT / "solutions").glob("*/*.ipynb")
            if p.parent.name != "quiz"}  # the quiz computes nothing worth timing
    assert lessons | labs == measured


@pytest.mark.parametrize("rel", LESSONS)
def test_every_lesson_marks_its_sections_core_or_deep_dive_with_their_time(rel):
    parts = sections(ROOT / rel)
    unmarked = [s.title for s in parts if s.kind is None]
    assert not unmarked, (f"{rel}: end these headings with '· core, ~N min' or '· deep dive "
                          f"(optional), ~N min' ('· ~N min' for the exercises): {unmarked}")
    # A section edited without its time: more than 2 minutes and a quarter off its estimate.
    drifted = [(s.title, s.stated_min, round(s.estimated_min, 1)) for s in parts[1:]
               if abs(s.stated_min - s.estimated_min) > max(2.0, 0.25 * s.estimated_min)]
    assert not drifted, f"{rel}: (section, stated, estimated minutes) {drifted}"


@pytest.mark.parametrize("rel", LESSONS)
def test_every_lesson_states_its_core_path_and_full_time_as_its_sections_add_up(rel):
    core, everything = reading_minutes(ROOT / rel)
    assert stated_reading(ROOT / rel) == (to_five(core), to_five(everything)), (core, everything)
    assert to_five(core) <= CORE_PATH_MAX_MIN, f"{rel}: the core path takes {core:.0f} minutes"


def test_reading_time_counts_words_exercises_and_refuses_an_unmarked_heading(tmp_path):
    nb = nbformat.v4.new_notebook()
    prose = " ".join(["word"] * (2 * PROSE_WORDS_PER_MIN))
    nb.cells = [
        nbformat.v4.new_markdown_cell("# T\n\nThe core path takes about 5 minutes; everything, "
                                      "with the deep dives and the exercises, about\n20 minutes."),
        nbformat.v4.new_markdown_cell(f"## 1. A · core, ~2 min\n\n{prose}"),
        nbformat.v4.new_markdown_cell(f"## 2. B · deep dive (optional), ~2 min\n\n{prose}\n"
                                      "```python\n## not a heading\n```"),
        nbformat.v4.new_markdown_cell("## 3. C\n\nunmarked"),
        nbformat.v4.new_markdown_cell("## Exercises · ~12 min\n\n1. one\n2. two\n\n"
                                      "### Answers\n\n1. yes\n2. no"),
    ]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    parts = sections(path)
    assert [(s.title, s.kind, s.stated_min) for s in parts] == [
        ("(start)", "start", None), ("1. A", "core", 2), ("2. B", "deep dive", 2),
        ("3. C", None, None), ("Exercises", "exercises", 12)]
    assert parts[1].estimated_min == pytest.approx(2, abs=0.05)
    assert parts[4].estimated_min == 2 * EXERCISE_MIN
    core, everything = reading_minutes(path)
    assert core == pytest.approx(parts[0].estimated_min + 2) and everything == core + 2 + 12
    assert stated_reading(path) == (5, 20)


def _notebook(path, first_cell: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(first_cell),
                nbformat.v4.new_code_cell("import time\nprint('start')\ntime.sleep(1.0)\n"
                                          "print('done')")]
    nbformat.write(nb, path)
    return path


def test_the_stated_time_is_read_across_line_breaks_and_refused_when_missing(tmp_path):
    wrapped = _notebook(tmp_path / "a.ipynb", "# A\n\nThe notebook runs top to bottom in about\n"
                                              "3 minutes on a 2-core CPU.")
    assert stated_time(wrapped) == ("about", 3.0) and budget_s(wrapped) == 225
    under = _notebook(tmp_path / "b.ipynb", "It runs top to bottom in under 1 minute.")
    assert budget_s(under) == 60
    vague = _notebook(tmp_path / "c.ipynb", "It runs in a minute or two.")
    with pytest.raises(ValueError, match="does not say 'runs top to bottom in about N minutes'"):
        stated_time(vague)


@pytest.mark.slow
def test_the_silence_watch_sees_a_cell_working_without_output(tmp_path):
    path = _notebook(tmp_path / "quiet.ipynb", "It runs top to bottom in under 1 minute.")
    wall, silence, cell = execute(path)
    # Printed lines reach the client in batches (ipykernel flushes every 0.2 s): a little less.
    assert cell == 1 and silence >= 0.6 and wall >= silence
