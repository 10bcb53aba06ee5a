"""The class in a box (`make hub`), in a real browser: three learners hand in the fixture lab
through their Assignments tab, the instructor grades, and each learner fetches their feedback.

The Makefile's own `make hub` recipe starts the hub, its proxy and its demo accounts
(hub/roster.py), on free ports, with its state in a scratch folder. Headless Chromium, driven
by selenium (tests/test_browser.py's browser and helpers), logs each learner in; their
JupyterLab starts as their own system account. Each learner opens Nbgrader > Assignment List
(the only item of the menu: no instructor tools), fetches lab0_fixture, edits the fetched
notebook (through the server's contents API, with the session's own cookie, as JupyterLab's
Save does) and clicks Submit:
    honest   both parts right                                        5 points
    half     mean right, running_max left as released               2 points
    attacker an AST transformer that turns the checkers' asserts into `pass`, with a wrong
             running_max (tests/hostile/cases.py, "ast_pass")       2 points, flagged
Then the instructor's commands (as the hub's operator runs them): collect, grade in the sandbox,
feedback into the exchange, export. Each learner clicks Fetch Feedback and opens the page: their
own score, no hidden test.

Root only (the hub switches to each user's account), and skipped with the reason without
configurable-http-proxy (`make hub-tools`, from npm), Chromium or chromedriver. About 2.5
minutes on 2 cores shared with other work (5 under a load average of 8), most of it three
JupyterLabs starting (30 to 45 s each under that load) and three gradings (13 s each).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from lab_server import ROOT, free_port, stop

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HUB_PROXY = ROOT / ".hub-tools" / "node_modules" / ".bin" / "configurable-http-proxy"
if os.geteuid() != 0:
    pytest.skip("the hub starts each user's JupyterLab as that user's account: needs root",
                allow_module_level=True)
if not HUB_PROXY.is_file():
    pytest.skip(f"no JupyterHub proxy in {HUB_PROXY.parent}: `make hub-tools` installs it with "
                "npm (`make test` does where npm is)", allow_module_level=True)
# Skips the module the same way where Chromium, chromedriver or selenium are missing.
from test_browser import WAIT_S, labelled, text_of, wait_for  # noqa: E402, I001
# test_browser's Chromium fixture, used here under this name.
from test_browser import browser as chromium  # noqa: E402, F401
from hostile.cases import FIXTURE_HIDDEN, INTEGRITY  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from test_hub_exchange import run  # noqa: E402  one instructor command, as the operator types it

sys.path.insert(0, str(ROOT / "hub"))
from roster import LEARNERS  # noqa: E402

LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"
PASSWORD = "gpulab-test"
MENU_ITEM = ".lm-Menu-item"
ATTACK = next(case for case in INTEGRITY if case.student_id == "ast_pass")
MEAN = "def mean(xs):\n    return sum(xs) / len(xs)"
RUNNING_MAX = ("def running_max(xs):\n    out, best = [], xs[0]\n    for x in xs:\n"
               "        best = max(best, x)\n        out.append(best)\n    return out")


@dataclass(frozen=True)
class Learner:
    name: str
    answers: dict[str, str]  # answer cell id -> its new source
    added: str = ""  # a cell of their own, after test_mean
    score: str = "5"
    flags: str = ""


HONEST, HALF, ATTACKER = (
    Learner(LEARNERS[0], {"mean": MEAN, "running_max": RUNNING_MAX}),
    Learner(LEARNERS[1], {"mean": MEAN}, score="2"),
    Learner(LEARNERS[2], {"mean": MEAN, **ATTACK.answers}, added=ATTACK.code.strip(),
            score="2", flags=ATTACK.flags[0]),
)


@dataclass(frozen=True)
class Hub:
    port: int
    state: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    @property
    def exchange(self) -> Path:
        return self.state / "exchange"

    @property
    def course(self) -> Path:
        return self.state / "course"

    @staticmethod
    def home(user: str) -> Path:
        """The folder the user's JupyterLab serves: their account's home."""
        return Path(pwd.getpwnam(user).pw_dir)


def hub_command(port: int, state: Path) -> list[str]:
    """`make hub` for the environment running these tests (its install step skipped)."""
    prefix = Path(sys.prefix)
    return ["make", "--no-print-directory", "-o", str(prefix / ".gpulab-installed"), "hub",
            f"VENV={prefix}", f"HUB_STATE={state}", f"HUB_PORT={port}"]


@contextlib.contextmanager
def running_hub(timeout: float = 120) -> Iterator[Hub]:
    # Not under pytest's tmp_path: every user's server must reach its home through it.
    state = Path(tempfile.mkdtemp(prefix="gpulab-hub-"))
    state.chmod(0o755)
    hub = Hub(free_port(), state)
    environ = dict(os.environ, GPULAB_HUB_PASSWORD=PASSWORD,
                   GPULAB_HUB_API_PORT=str(free_port()),
                   GPULAB_HUB_PROXY_API_PORT=str(free_port()))
    log = state / "hub.log"
    with log.open("w") as out:
        server = subprocess.Popen(hub_command(hub.port, state), cwd=ROOT, env=environ,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not answers(hub.url("hub/login")):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`make hub` never answered:\n{log.read_text()[-5000:]}")
            time.sleep(0.5)
        yield hub
    finally:
        stop(server)  # the hub stops every user's server and its proxy on the way out
        shutil.rmtree(state, ignore_errors=True)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False




def clear_fetched(hub: Hub) -> None:
    """The demo accounts' copies of the fixture lab, from an earlier run or a demo."""
    for learner in (HONEST, HALF, ATTACKER):
        shutil.rmtree(hub.home(learner.name) / LAB, ignore_errors=True)


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """A course repository holding the fixture lab, released."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "tests" / "fixtures" / "solutions", root / "solutions")
    run("release", LAB, "--root", str(root))
    return root


@pytest.fixture(scope="module")
def hub(lab_root) -> Iterator[Hub]:
    with running_hub() as hub:
        clear_fetched(hub)
        run("publish", LAB, "--root", str(lab_root), "--course-dir", str(hub.course),
            "--exchange", str(hub.exchange))
        yield hub
        clear_fetched(hub)


def log_in(browser, hub: Hub, user: str) -> None:
    """Log `user` in and wait for their JupyterLab (started as their account) to be ready."""
    browser.get(hub.url("hub/logout"))
    browser.get(hub.url("hub/login"))
    wait_for(browser, lambda b: b.find_elements(By.ID, "username_input"), "the login form")
    browser.find_element(By.ID, "username_input").send_keys(user)
    browser.find_element(By.ID, "password_input").send_keys(PASSWORD)
    browser.find_element(By.ID, "login_submit").click()
    wait_for(browser, lambda b: f"/user/{user}/lab" in b.current_url
             and labelled(b, ".lm-MenuBar-item", "Nbgrader"), f"{user}'s JupyterLab")


def open_assignments(browser) -> list[str]:
    """Nbgrader > Assignment List; returns the menu's items."""
    labelled(browser, ".lm-MenuBar-item", "Nbgrader")[0].click()
    items = wait_for(browser, lambda b: [e for e in b.find_elements(By.CSS_SELECTOR, MENU_ITEM)
                                         if e.text.strip()], "the Nbgrader menu")
    names = [item.text.split("\n")[0] for item in items]
    labelled(browser, MENU_ITEM, "Assignment List")[0].click()
    return names


def click_in(browser, panel: str, button: str) -> None:
    """Click `button` on lab0_fixture's row of one list of the Assignments tab."""
    def row_button(b):
        rows = b.find_elements(By.CSS_SELECTOR, f"#{panel} .list_item")
        return [e for row in rows if LAB in row.text
                for e in row.find_elements(By.TAG_NAME, "button") if e.text == button]
    wait_for(browser, row_button, f"{button} on {LAB} in {panel}")[0].click()


def contents(browser, user: str, method: str, path: str, body: dict | None = None) -> dict:
    """A request to the user's contents API from the page, with its cookie and XSRF token."""
    script = """
        const [url, method, body, done] = arguments;
        const xsrf = decodeURIComponent((document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || "");
        fetch(url, {method, headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"},
                    body: body ? JSON.stringify(body) : undefined})
          .then(r => r.text().then(text => done({status: r.status, text})));
    """
    browser.set_script_timeout(WAIT_S)
    reply = browser.execute_async_script(script, f"/user/{user}/api/contents/{path}", method, body)
    assert reply["status"] in (200, 201), f"{method} {path}: {reply}"
    return json.loads(reply["text"])


def edit_and_save(browser, learner: Learner) -> None:
    path = f"{LAB}/{NOTEBOOK}"
    nb = nbformat.from_dict(contents(browser, learner.name, "GET", path)["content"])
    for cell in nb.cells:
        if cell.get("id") in learner.answers:
            cell.source = learner.answers[cell.id]
    if learner.added:
        after = next(i for i, cell in enumerate(nb.cells) if cell.get("id") == ATTACK.after)
        nb.cells.insert(after + 1, nbformat.v4.new_code_cell(learner.added))
    contents(browser, learner.name, "PUT", path, {"type": "notebook", "format": "json",
                                                  "content": nb})


def hand_in(browser, hub: Hub, learner: Learner) -> None:
    started = time.monotonic()
    log_in(browser, hub, learner.name)
    print(f"{learner.name}: JupyterLab ready in {time.monotonic() - started:.0f} s")
    menu = open_assignments(browser)
    assert menu == ["Assignment List"], f"a learner's Nbgrader menu shows {menu}"
    click_in(browser, "released_assignments_list", "Fetch")
    wait_for(browser, lambda b: LAB in text_of(b, "#fetched_assignments_list"),
             f"{LAB} fetched")
    edit_and_save(browser, learner)
    click_in(browser, "fetched_assignments_list", "Submit")
    wait_for(browser, lambda b: LAB in text_of(b, "#submitted_assignments_list"),
             f"{LAB} in {learner.name}'s submitted list")


def fetch_feedback(browser, hub: Hub, learner: Learner) -> str:
    """The learner's feedback page as their browser shows it, fetched from the Assignments tab."""
    log_in(browser, hub, learner.name)
    open_assignments(browser)
    click_in(browser, "submitted_assignments_list", "Fetch Feedback")
    pages = wait_for(browser, lambda b: sorted(
        hub.home(learner.name).glob(f"{LAB}/feedback/*/{LAB}.html")), "the feedback page")
    relative = pages[-1].relative_to(hub.home(learner.name))
    browser.get(hub.url(f"user/{learner.name}/files/{relative}"))
    return wait_for(browser, lambda b: b.find_element(By.TAG_NAME, "body").text, "the page")


def test_three_learners_hand_in_are_graded_in_the_sandbox_and_fetch_their_own_feedback(
        chromium, hub, lab_root, tmp_path):  # noqa: F811 (the fixture imported above)
    learners = (HONEST, HALF, ATTACKER)
    for learner in learners:
        hand_in(chromium, hub, learner)

    course = ("--root", str(lab_root), "--course-dir", str(hub.course))
    assert "collected 3 new submissions" in run("collect", LAB, *course,
                                                "--exchange", str(hub.exchange))
    run("grade", LAB, *course)
    run("feedback", LAB, *course, "--exchange", str(hub.exchange))
    run("export", *course, "--output", str(tmp_path / "grades.csv"))
    grades = {row["student_id"]: row for row in csv.DictReader((tmp_path / "grades.csv").open())}
    for learner in learners:
        assert grades[learner.name]["score"] == learner.score, grades[learner.name]
        assert learner.flags in grades[learner.name]["flags"], grades[learner.name]
    assert not grades[HONEST.name]["flags"] and not grades[HALF.name]["flags"]

    for learner in learners:
        page = fetch_feedback(chromium, hub, learner)
        assert f"{learner.score}.0 / 5.0" in page, (
            f"{learner.name}'s feedback does not show their score {learner.score}:\n{page[:1500]}")
        leaked = [marker for marker in FIXTURE_HIDDEN if marker in page]
        assert not leaked, f"{learner.name}'s feedback shows hidden tests: {leaked}"
