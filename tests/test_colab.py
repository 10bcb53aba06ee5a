"""Every lesson and graded notebook opens with the Colab badge and setup cell of this release;
the setup cell installs gpulab in Colab only, and the install it runs works from a clean
virtual environment (the slow test)."""

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from gpulab import colab
from gpulab.colab import Release

ROOT = Path(__file__).resolve().parents[1]
RELEASE = Release("https://github.com/someone/course", "v1.2.3")


def setup_cell(nb, name="the notebook") -> nbformat.NotebookNode:
    found = [c for c in nb.cells if c.get("id") == colab.SETUP_ID]
    assert len(found) == 1, (
        f"{name} has {len(found)} Colab setup cells, not one: run `python -m gpulab.colab`, then "
        "`python -m autograder release LAB` for a lab")
    return found[0]


# ------------------------------------------------------------------------ the committed notebooks


def test_every_notebook_has_this_releases_colab_cells():
    release = Release.from_pyproject(ROOT / "pyproject.toml")
    stale = [nb.relative_to(ROOT).as_posix() for nb in colab.notebooks(ROOT)
             if colab.update(ROOT, release, nb, write=False)]
    assert not stale, (
        f"{stale}: the Colab badge or setup cell is missing, stale or misplaced. Run "
        "`python -m gpulab.colab`, then `python -m autograder release LAB` for each changed lab.")


def test_every_lesson_and_lab_is_covered():
    covered = {p.relative_to(ROOT).as_posix() for p in colab.notebooks(ROOT)}
    lessons = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("lessons/*.ipynb")}
    sources = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("solutions/*/*.ipynb")}
    assert lessons and sources and covered == lessons | sources


@pytest.mark.parametrize("path", colab.notebooks(ROOT), ids=lambda p: p.name)
def test_setup_is_the_first_code_cell_and_imports_no_gpulab(path):
    """`import gpulab` must still come before numba.cuda: the setup cell imports neither."""
    nb = nbformat.read(path, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.get("id") == colab.SETUP_ID, (
        "the first code cell is not the Colab setup cell: run `python -m gpulab.colab`")
    tree = ast.parse(TransformerManager().transform_cell(first_code.source))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"os", "sys"}
    assert not first_code.get("outputs"), "the setup cell printed something outside Colab"


def test_released_labs_carry_the_locked_cells_and_open_the_learner_version():
    for lab in sorted(p for p in (ROOT / "labs").iterdir() if p.is_dir()):
        for path in lab.glob("*.ipynb"):
            nb = nbformat.read(path, as_version=4)
            cell = setup_cell(nb, path.relative_to(ROOT))
            assert cell.metadata["nbgrader"]["locked"] and not cell.metadata["nbgrader"]["grade"]
            (badge,) = [c for c in nb.cells if c.get("id") == colab.BADGE_ID]
            assert f"/labs/{lab.name}/{path.name})" in badge.source
            assert "solutions" not in badge.source


# ----------------------------------------------------------------------------- the script


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _write_course(root: Path, url="https://github.com/someone/course"):
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "gpulab"\nversion = "1.2.3"\n[project.urls]\nRepository = "{url}"\n')
    title = nbformat.v4.new_markdown_cell("# Title", id="title")
    imports = nbformat.v4.new_code_cell("import gpulab", id="imports")
    for rel in ("lessons/01_intro.ipynb", "solutions/quiz/quiz.ipynb"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(_notebook(title, imports), root / rel)


def test_main_inserts_then_check_passes_and_a_second_run_changes_nothing(tmp_path, capsys):
    _write_course(tmp_path)
    assert colab.main(["--root", str(tmp_path), "--check"]) == 1
    assert "stale: solutions/quiz/quiz.ipynb" in capsys.readouterr().out
    assert colab.main(["--root", str(tmp_path)]) == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")}
    assert colab.main(["--root", str(tmp_path), "--check"]) == 0
    assert colab.main(["--root", str(tmp_path)]) == 0
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")} == before

    lesson = nbformat.read(tmp_path / "lessons/01_intro.ipynb", as_version=4)
    assert [c.get("id") for c in lesson.cells] == ["title", "colab-badge", "colab-setup", "imports"]
    assert "nbgrader" not in setup_cell(lesson).metadata
    assert "blob/v1.2.3/lessons/01_intro.ipynb)" in lesson.cells[1].source
    quiz = nbformat.read(tmp_path / "solutions/quiz/quiz.ipynb", as_version=4)
    assert setup_cell(quiz).metadata["nbgrader"]["grade_id"] == "colab_setup"
    assert "blob/v1.2.3/labs/quiz/quiz.ipynb)" in quiz.cells[1].source


def test_a_new_version_updates_the_cells_in_place(tmp_path):
    _write_course(tmp_path)
    colab.main(["--root", str(tmp_path)])
    path = tmp_path / "lessons/01_intro.ipynb"
    nb = nbformat.read(path, as_version=4)
    setup_cell(nb).metadata["execution"] = {"iopub.status.idle": "then"}  # an executed lesson
    nbformat.write(nb, path)
    assert colab.main(["--root", str(tmp_path), "--check"]) == 0, "metadata alone is not stale"

    text = (tmp_path / "pyproject.toml").read_text().replace("1.2.3", "1.3.0")
    (tmp_path / "pyproject.toml").write_text(text)
    assert colab.main(["--root", str(tmp_path), "--check"]) == 1
    colab.main(["--root", str(tmp_path)])
    nb = nbformat.read(path, as_version=4)
    assert [c.get("id") for c in nb.cells].count("colab-setup") == 1
    assert "@v1.3.0" in setup_cell(nb).source and "v1.2.3" not in json.dumps(nb)
    assert setup_cell(nb).metadata["execution"] == {"iopub.status.idle": "then"}


def test_misplaced_cells_move_back_to_the_top():
    badge, setup = colab.colab_cells(RELEASE, "lessons/x.ipynb", graded=False)
    title = nbformat.v4.new_markdown_cell("# Title", id="title")
    code = nbformat.v4.new_code_cell("import gpulab", id="imports")
    nb = colab.with_colab_cells(_notebook(title, code, badge, setup), badge, setup)
    assert [c.get("id") for c in nb.cells] == ["title", "colab-badge", "colab-setup", "imports"]
    nb = colab.with_colab_cells(_notebook(code), badge, setup)  # no markdown first: at the top
    assert [c.get("id") for c in nb.cells] == ["colab-badge", "colab-setup", "imports"]


@pytest.mark.parametrize("url", ["", "https://gitlab.com/a/b", "git@github.com:a/b.git"])
def test_a_repository_colab_cannot_open_is_refused(tmp_path, url):
    _write_course(tmp_path, url)
    with pytest.raises(ValueError, match=r"\[project.urls\] Repository"):
        Release.from_pyproject(tmp_path / "pyproject.toml")


# ----------------------------------------------------------------------------- the setup cell


def _run_setup(monkeypatch, capsys, colab_env: bool, colab_module: bool):
    """Execute the setup cell as IPython would, with the %pip magic recorded, not run."""
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if colab_env:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261126")
    if colab_module:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    magics = []

    class Shell:
        def run_line_magic(self, name, line, *args):
            magics.append((name, line))

    code = TransformerManager().transform_cell(colab.setup_source(RELEASE))
    exec(code, {"get_ipython": Shell})  # the cell's own code, with a recording shell
    return magics, capsys.readouterr().out


def test_outside_colab_the_setup_cell_does_nothing(monkeypatch, capsys):
    magics, printed = _run_setup(monkeypatch, capsys, colab_env=False, colab_module=False)
    assert magics == [] and printed == ""


@pytest.mark.parametrize("colab_env, colab_module", [(True, False), (False, True)])
def test_in_colab_the_setup_cell_pip_installs_the_release(monkeypatch, capsys, colab_env,
                                                           colab_module):
    magics, printed = _run_setup(monkeypatch, capsys, colab_env, colab_module)
    assert magics == [("pip", 'install --quiet "gpulab @ git+https://github.com/someone/course'
                              '@v1.2.3"')]
    assert "gpu runner" in printed
    from gpulab.env import in_colab

    assert in_colab(), "the setup cell and gpulab must agree on what Colab is"


def test_pip_arguments_and_the_swap_to_a_local_repository(tmp_path):
    args = colab.pip_arguments(colab.setup_source(RELEASE))
    assert args == ["install", "--quiet", "gpulab @ git+https://github.com/someone/course@v1.2.3"]
    local = colab.for_local_repository(args, RELEASE, tmp_path)
    assert local == ["install", "--quiet", f"gpulab @ git+file://localhost{tmp_path.resolve()}"]
    other = Release("https://github.com/someone/course", "v9.9.9")
    with pytest.raises(ValueError, match="nothing to swap"):
        colab.for_local_repository(args, other, tmp_path)
    with pytest.raises(ValueError, match="one `%pip install` line"):
        colab.pip_arguments("import os")


# ----------------------------------------------------------------------------- the install itself


def _clean_env() -> dict[str, str]:
    """This process's environment without its virtual environment or import paths; pip's own
    settings (index, find-links, cache) stay, so the cache is shared."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "NUMBA_ENABLE_CUDASIM", "GPULAB_RUNNER"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(cmd, cwd, env):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def _preinstalled_torch(env) -> Path:
    """A folder holding torch and its dependencies, put there by pip from the pinned CPU build,
    as Colab's image holds its torch outside anything a notebook installs. Unpacking torch
    takes minutes, so the folder is built once per pin and Python and then reused, like pip's
    cache beside it."""
    pin = (ROOT / "constraints" / "cpu.txt").read_text()
    key = hashlib.sha256(f"{sys.version_info[:2]} {pin}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base = cache / "gpulab" / f"colab-torch-{key}"
    if not base.is_dir():
        partial = base.with_name(f"{base.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        index = os.environ.get("TORCH_CPU_INDEX")  # as in the Makefile, where no local wheel is
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(partial),
              "-c", str(ROOT / "constraints" / "cpu.txt"), "torch",
              *(["--extra-index-url", index] if index else [])], partial.parent, env)
        try:
            partial.rename(base)  # whole or not at all
        except OSError:  # built meanwhile by another run
            shutil.rmtree(partial, ignore_errors=True)
    return base


@pytest.mark.slow
def test_the_setup_cells_install_works_in_a_clean_venv(tmp_path):
    """Colab's situation: a Python with torch already installed. The setup cell's own pip
    command, installing from this repository's HEAD instead of the release tag, must give an
    importable gpulab and leave that torch alone."""
    release = Release.from_pyproject(ROOT / "pyproject.toml")
    nb = nbformat.read(ROOT / "lessons/01_gpu_architecture.ipynb", as_version=4)
    args = colab.for_local_repository(colab.pip_arguments(setup_cell(nb).source), release, ROOT)
    env, venv = _clean_env(), tmp_path / "venv"
    torch_site = _preinstalled_torch(env)
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                tmp_path, env).strip()
    (Path(site) / "colab_preinstalled.pth").write_text(f"{torch_site}\n")
    show_torch = "import torch, os; print(torch.__file__, os.stat(torch.__file__).st_ino)"
    torch_before = _run([python, "-c", show_torch], tmp_path, env).strip()
    assert torch_before.startswith(str(torch_site))

    _run([python, "-m", "pip", *args], tmp_path, env)

    where = _run([python, "-c", "import gpulab; print(gpulab.__file__, gpulab.runner.name)"],
                 tmp_path, env).split()
    assert Path(where[0]).resolve().is_relative_to(venv.resolve()), (
        f"gpulab was imported from {where[0]}, not from the install in the clean venv")
    assert where[1] in ("cpu", "gpu")
    assert _run([python, "-c", show_torch], tmp_path, env).strip() == torch_before, (
        "installing gpulab replaced the torch that was already there (Colab's CUDA build)")
