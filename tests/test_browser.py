"""A real browser on the learner's JupyterLab (`make lab`): what a learner sees, not what the
kernel sent.

Headless Chromium, driven by selenium, opens two small notebooks in a temporary folder served by
the Makefile's own `make lab` recipe, and runs them from the Run menu:
  - explorer.ipynb shows the waves explorer of Lesson 01: it renders as widgets, and its summary
    changes when the slider moves (arrow key on the handle, as a learner would);
  - saxpy.ipynb is Lab 1's imports, its saxpy answer with a known mistake (tests/grading_specs)
    and its visible test cell: the cell fails with the checker's teaching message, shown short;
and the page has nbgrader's Validate button but not its instructor menu (tests/test_lab_roles).
About 45 s on 2 cores. Skipped, with the reason, without selenium, Chromium or chromedriver
(`make test` installs the last two where it can: Debian's `chromium` and `chromium-driver`).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from grading_specs import LAB1
from lab_server import LabServer, running_lab
from lab_submissions import Lab, cell_by_grade_id

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))),
                None)
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("needs Chromium and chromedriver (apt-get install chromium chromium-driver; "
                "`make test` installs them when run as root)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install "
                                "selenium; part of the `course` extra)")
from selenium.common.exceptions import (  # noqa: E402 (once selenium is known)
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# Each wait ends when the page shows what it waits for; the limit only ends a wait that never
# would. A cold kernel importing gpulab (numba, matplotlib) on a busy 2-core machine takes tens
# of seconds, and with two `make test` runs side by side a hub's Assignments list took over 90.
WAIT_S = 300
SHORT_TRACEBACK_LINES = 15  # IPython's full traceback through the simulator runs to 60-80
OFF_BY_ONE = next(m for m in LAB1.mistakes if m.student_id == "off_by_one")
PYTHON3 = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                          "language": "python"}}
# What the page shows, by JupyterLab's and ipywidgets' CSS classes.
STATUS_BAR = "#jp-main-statusbar"
SLIDER = ".jp-OutputArea-output .widget-slider"
EXPLORER_SUMMARY = ".widget-output .jp-OutputArea-output"  # the explorer's Output widget
CELL_ERROR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'


def write_notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook(metadata=PYTHON3)
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, path)


def write_scratch_notebooks(folder: Path) -> None:
    write_notebook(folder / "explorer.ipynb",
                   "import gpulab\nfrom gpulab.explorers import waves_explorer\n\n"
                   "waves_explorer()")
    lab1 = Lab("lab1_cuda_kernels")
    released, wrong = lab1.released(), lab1.with_mistake(OFF_BY_ONE)
    (imports,) = [cell for cell in released.cells if cell.get("id") == "imports"]
    write_notebook(folder / "saxpy.ipynb", imports.source,
                   cell_by_grade_id(wrong, OFF_BY_ONE.cell).source,
                   cell_by_grade_id(released, OFF_BY_ONE.test).source)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[LabServer]:
    folder = tmp_path_factory.mktemp("served")
    write_scratch_notebooks(folder)
    with running_lab("lab", folder, tmp_path_factory.mktemp("runtime")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def text_of(browser, selector: str) -> str:
    return "\n".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, selector))


def labelled(browser, selector: str, label: str) -> list:
    """The elements matching `selector` whose first line of text is `label` (a menu item's
    next line is its shortcut)."""
    return [e for e in browser.find_elements(By.CSS_SELECTOR, selector)
            if e.text.split("\n")[0] == label]


def wait_for(browser, condition: Callable, what: str):
    """condition(browser)'s first truthy value; after WAIT_S, a failure naming `what` and
    showing the status bar and every output on the page."""
    try:
        # A redraw may replace an element between finding it and reading it: read again.
        return WebDriverWait(browser, WAIT_S, ignored_exceptions=(
            StaleElementReferenceException,)).until(condition)
    except TimeoutException:
        pytest.fail(f"waited {WAIT_S} s for {what}. Status bar: {text_of(browser, STATUS_BAR)!r}"
                    f"\nOutputs:\n{text_of(browser, '.jp-OutputArea-output')}")


def open_notebook(browser, lab: LabServer, notebook: str) -> None:
    """Open `notebook` alone in a workspace of its own (no other notebook's tab restored) and
    click its tab: until something on the page is clicked, no tab may count as the current one
    and the Run menu acts on none."""
    browser.get(lab.url(f"lab/workspaces/{Path(notebook).stem}/tree/{notebook}"))
    tab = wait_for(browser, lambda b: labelled(b, ".lm-DockPanel-tabBar .lm-TabBar-tab", notebook),
                   f"the tab of {notebook}")
    tab[0].click()


def open_and_run_all(browser, lab: LabServer, notebook: str) -> None:
    """Open `notebook` and, once its kernel is idle, click Run > Run All Cells."""
    open_notebook(browser, lab, notebook)
    wait_for(browser, lambda b: "| Idle" in text_of(b, STATUS_BAR), f"{notebook}'s kernel")
    labelled(browser, ".lm-MenuBar-item", "Run")[0].click()
    wait_for(browser, lambda b: labelled(b, ".lm-Menu-item", "Run All Cells"),
             "the Run menu")[0].click()


def test_an_explorer_renders_as_widgets_and_redraws_when_a_slider_moves(browser, lab):
    open_and_run_all(browser, lab, "explorer.ipynb")
    handle = wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, f"{SLIDER} .noUi-handle"),
                      "the explorer's slider")[0]
    wait_for(browser, lambda b: "x 1 resident block per SM" in text_of(b, EXPLORER_SUMMARY),
             "the explorer's summary for 1 block per SM")
    before = text_of(browser, EXPLORER_SUMMARY)

    handle.click()
    handle.send_keys(Keys.ARROW_RIGHT)  # resident blocks per SM: 1 -> 2

    wait_for(browser, lambda b: "x 2 resident blocks per SM" in text_of(b, EXPLORER_SUMMARY),
             "the summary to follow the slider to 2 blocks per SM")
    assert text_of(browser, EXPLORER_SUMMARY) != before


def test_a_lab_test_cell_fails_with_the_checkers_short_message(browser, lab):
    open_and_run_all(browser, lab, "saxpy.ipynb")
    error = wait_for(browser, lambda b: text_of(b, CELL_ERROR), "the test cell's error")
    assert re.search(OFF_BY_ONE.teaching, error), f"the checker's hint is not shown:\n{error}"
    lines = error.strip().splitlines()
    assert len(lines) < SHORT_TRACEBACK_LINES, (
        f"the failure shows {len(lines)} lines, not the checker's short message:\n{error}")


def test_learners_see_validate_but_not_nbgraders_instructor_tools(browser, lab):
    open_notebook(browser, lab, "explorer.ipynb")
    # Documents open after every plugin has started: the menus are complete by now.
    wait_for(browser, lambda b: "Validate" in text_of(b, ".jp-NotebookPanel-toolbar"),
             "nbgrader's Validate button")
    menus = [item.text for item in browser.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")]
    assert "Run" in menus and "Nbgrader" not in menus, menus
    assert not browser.find_elements(By.ID, "nbgrader-create_assignemnt")  # nbgrader's spelling
