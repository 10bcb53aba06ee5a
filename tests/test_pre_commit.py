"""The repository's .pre-commit-config.yaml runs what `make lint` runs: `ruff check`, through
astral-sh/ruff-pre-commit, on the folders the Makefile's lint target names, fixing nothing. Both
files are read as they are (no network, no pre-commit needed)."""

import re
import shlex
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RUFF_REPO = "https://github.com/astral-sh/ruff-pre-commit"


def lint_folders() -> list[str]:
    """The folders that the Makefile's lint recipe hands to `ruff check`."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("lint:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    (command,) = [line for line in recipe if "ruff check" in line]
    words = shlex.split(command)
    return [w for w in words[words.index("check") + 1:] if not w.startswith("-")]


def ruff_hook() -> tuple[dict, dict]:
    """The ruff-pre-commit repo entry and its ruff check hook."""
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (repo,) = [r for r in config["repos"] if r["repo"] == RUFF_REPO]
    (hook,) = [h for h in repo["hooks"] if h["id"] in ("ruff-check", "ruff")]
    return repo, hook


def test_the_ruff_hook_checks_the_folders_make_lint_checks():
    folders = lint_folders()
    assert folders, "the Makefile's lint target runs `ruff check` on no folder"
    repo, hook = ruff_hook()
    files = re.compile(hook.get("files", ""))  # pre-commit matches paths with re.search
    exclude = re.compile(hook["exclude"]) if "exclude" in hook else None

    def hooked(path: str) -> bool:
        return bool(files.search(path)) and not (exclude and exclude.search(path))

    for folder in folders:
        assert hooked(f"{folder}/module.py"), (
            f"`make lint` checks {folder}/ but the pre-commit hook skips it: add it to `files`")
    others = sorted(p.name for p in ROOT.iterdir()
                    if p.is_dir() and not p.name.startswith(".") and p.name not in folders)
    for other in others:
        assert not hooked(f"{other}/module.py"), (
            f"the pre-commit hook checks {other}/, which `make lint` does not: a commit could "
            "fail on what CI accepts")
    assert not any(arg.startswith(("--fix", "--unsafe-fixes")) for arg in hook.get("args", [])), \
        "`make lint` only reports; a hook that fixes would change files during a commit"


def test_the_ruff_hook_is_pinned_within_the_projects_ruff_range():
    repo, _ = ruff_hook()
    assert re.fullmatch(r"v\d+\.\d+\.\d+", repo["rev"]), f"pin a ruff release, got {repo['rev']}"
    course = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["course"]
    (floor,) = [r.split(">=")[1] for r in course if r.startswith("ruff>=")]
    pinned = tuple(int(x) for x in repo["rev"][1:].split("."))
    assert pinned >= tuple(int(x) for x in floor.split(".")), (
        f"the hook's ruff {repo['rev']} is older than pyproject.toml's ruff>={floor}")
