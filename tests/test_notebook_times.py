"""Every lesson and lab solution states how long it runs, in the one form `make bench` reads
(benchmarks/bench_notebooks.py), and the benchmark's silence watch sees a cell that works
without printing. No time is asserted here: the benchmark compares, on a quiet machine."""

import sys

import nbformat
import pytest
from lab_submissions import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_notebooks import NOTEBOOKS, budget_s, execute, stated_time  # noqa: E402


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
