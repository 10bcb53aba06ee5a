"""The "Open in Colab" badge and the Colab setup cell at the top of every notebook of the course.

    python -m gpulab.colab            insert or update both cells in lessons/ and solutions/
    python -m gpulab.colab --check    exit 1, naming each notebook whose cells are missing or stale

Where the course lives comes from one place, pyproject.toml: the repository is
[project.urls] Repository and the release is the tag "v" + [project] version. The setup cell
installs gpulab from that tag, with its dependencies, when it runs in Colab; Colab's own CUDA
build of torch already satisfies gpulab's `torch>=2.4`, so pip keeps it. Anywhere else (your
machine, the grading sandbox) the cell does nothing and prints nothing. It imports no gpulab:
the notebook's own `import gpulab` still comes before anything imports numba.cuda.

Both cells go right after the notebook's first cell when that is markdown (the title and what
you will learn), else at the top. In a graded notebook (solutions/) they are locked nbgrader
cells, so autograding restores them; `python -m autograder release LAB` then copies them into
labs/, and the badge of a lab opens the learner's version (labs/), never the solution.
Taught in: README.md, "Colab".
"""

from __future__ import annotations

import argparse
import copy
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.notebooknode import NotebookNode

BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"  # cell ids; nbgrader grade_ids use "_"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
GITHUB = re.compile(r"https://github\.com/(?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(?:\.git)?/?")
SETUP_TEMPLATE = """\
# Google Colab only: install gpulab ({tag}) and its dependencies, keeping Colab's
# own torch. On your machine or in the grader this cell does nothing.
import os
import sys

if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
    %pip install --quiet "{requirement}"
    print("gpulab is installed. A GPU runtime (Runtime > Change runtime type) gives the "
          "gpu runner; without one the course runs on its cpu runner.")"""
PIP_LINE = re.compile(r"^\s*%pip (?P<args>install .*)$", re.M)


@dataclass(frozen=True)
class Release:
    """The published course that Colab opens notebooks from and installs gpulab from."""

    repository: str  # https://github.com/<owner>/<name>, from [project.urls] Repository
    tag: str  # the git tag of this release: "v" + [project] version

    @classmethod
    def from_pyproject(cls, path: Path) -> Release:
        project = tomllib.loads(Path(path).read_text())["project"]
        url = project.get("urls", {}).get("Repository", "")
        if not GITHUB.fullmatch(url):
            raise ValueError(
                f"{path}: [project.urls] Repository = {url!r} is not a GitHub repository URL "
                "(https://github.com/<owner>/<name>); Colab opens notebooks only from GitHub.")
        return cls(repository=url.rstrip("/").removesuffix(".git"), tag=f"v{project['version']}")

    @property
    def requirement(self) -> str:
        """What pip installs in Colab: gpulab at this release's tag."""
        return f"gpulab @ git+{self.repository}@{self.tag}"

    def colab_url(self, path: str) -> str:
        """Colab's address of the notebook at `path` (in the repository) in this release."""
        github = GITHUB.fullmatch(self.repository)
        return (f"https://colab.research.google.com/github/{github['owner']}/{github['name']}"
                f"/blob/{self.tag}/{path}")


def badge_source(release: Release, path: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({release.colab_url(path)})"


def setup_source(release: Release) -> str:
    return SETUP_TEMPLATE.format(tag=release.tag, requirement=release.requirement)


def pip_arguments(source: str) -> list[str]:
    """The arguments of the setup cell's `%pip` line, as pip receives them."""
    lines = PIP_LINE.findall(source)
    if len(lines) != 1:
        raise ValueError(f"expected one `%pip install` line in the setup cell, found {len(lines)}")
    return shlex.split(lines[0])


def for_local_repository(args: list[str], release: Release, root: Path) -> list[str]:
    """The same pip arguments, installing from the git repository at `root` (its HEAD) instead
    of the published tag: what a test can reach without the network."""
    published = f"git+{release.repository}@{release.tag}"
    # "localhost": pip before 24.1 refuses a git+file URL without a host; git accepts either.
    local = f"git+file://localhost{Path(root).resolve().as_posix()}"
    swapped = [arg.replace(published, local) for arg in args]
    if swapped == args:
        raise ValueError(f"{published!r} is not in the pip arguments {args}: nothing to swap")
    return swapped


# ----------------------------------------------------------------------------- the notebooks


def notebooks(root: Path) -> list[Path]:
    """Every notebook that gets the cells: the lessons and the graded notebooks' sources."""
    root = Path(root)
    return sorted(root.glob("lessons/*.ipynb")) + sorted(root.glob("solutions/*/*.ipynb"))


def opened_path(root: Path, notebook: Path) -> str:
    """The repository path that the badge opens: a graded notebook's learner version in labs/."""
    rel = Path(notebook).resolve().relative_to(Path(root).resolve())
    if rel.parts[0] == "solutions":
        rel = Path("labs", *rel.parts[1:])
    return rel.as_posix()


def colab_cells(release: Release, path: str, graded: bool) -> tuple[NotebookNode, NotebookNode]:
    badge = nbformat.v4.new_markdown_cell(badge_source(release, path), id=BADGE_ID)
    setup = nbformat.v4.new_code_cell(setup_source(release), id=SETUP_ID)
    if graded:  # locked: autograding puts back the lab's copy of an edited or deleted cell
        for cell in (badge, setup):
            cell.metadata["nbgrader"] = {
                "grade": False, "grade_id": cell.id.replace("-", "_"), "locked": True,
                "schema_version": 3, "solution": False, "task": False}
    return badge, setup


def with_colab_cells(nb: NotebookNode, badge: NotebookNode, setup: NotebookNode) -> NotebookNode:
    """A copy of `nb` with the two cells in place. A cell already there keeps its metadata (an
    executed lesson's timings) and, while its source is unchanged, its outputs."""
    nb = copy.deepcopy(nb)
    old = {cell.get("id"): cell for cell in nb.cells if cell.get("id") in (BADGE_ID, SETUP_ID)}
    nb.cells = [cell for cell in nb.cells if cell.get("id") not in (BADGE_ID, SETUP_ID)]
    placed = [_refreshed(old.get(new.id), new) for new in (badge, setup)]
    at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells[at:at] = placed
    return nb


def _refreshed(old: NotebookNode | None, new: NotebookNode) -> NotebookNode:
    if old is None or old.cell_type != new.cell_type:
        return new
    cell = copy.deepcopy(old)
    if cell.source != new.source and cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    cell.source = new.source
    cell.metadata.pop("nbgrader", None)
    cell.metadata.update(new.metadata)
    return cell


def update(root: Path, release: Release, notebook: Path, write: bool) -> bool:
    """Whether `notebook` lacked the current cells; with `write`, put them in."""
    nb = nbformat.read(notebook, as_version=4)
    graded = Path(notebook).resolve().is_relative_to(Path(root).resolve() / "solutions")
    wanted = with_colab_cells(nb, *colab_cells(release, opened_path(root, notebook), graded))
    if wanted == nb:
        return False
    if write:
        nbformat.validate(wanted)
        nbformat.write(wanted, notebook)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.colab", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook's cells are missing or stale")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the course repository (default: the one this gpulab is in)")
    args = parser.parse_args(argv)
    release = Release.from_pyproject(args.root / "pyproject.toml")
    changed = [nb for nb in notebooks(args.root) if update(args.root, release, nb, not args.check)]
    for nb in changed:
        print(f"{'stale' if args.check else 'updated'}: {nb.relative_to(args.root)}")
    if args.check and changed:
        print("Run `python -m gpulab.colab`, then `python -m autograder release LAB` for each "
              "changed lab.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
