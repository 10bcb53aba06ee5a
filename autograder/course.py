"""Where a course's files live, and the nbgrader configuration built from them.

Two places, kept apart on purpose:

    repository   solutions/<lab>/<lab>.ipynb  the only hand-edited copy of a lab (with answers)
                 labs/<lab>/<lab>.ipynb       the released student version, committed
    grading root an nbgrader course root (source/, release/, submitted/, autograded/,
                 feedback/, gradebook.db); `.grading/` by default, gitignored

Grading never writes into the repository: the lab's sources are copied into the grading root.
Every path is a field of `Course`, so tests point a whole course at a tmp_path.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

COURSE_ID = "gpulab"
# A lab (nbgrader: an assignment) and a student id become folder names and gradebook keys.
LAB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")
# Editor and interpreter leftovers that may sit in a lab folder; anything else is refused.
IGNORED_NAMES = frozenset({".ipynb_checkpoints", "__pycache__", ".DS_Store"})
# The last line of a Python traceback: "nbclient.exceptions.DeadKernelError: Kernel died".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit): ")


class CourseError(RuntimeError):
    """The course's files are not as the command needs them; the message says what to do."""


def repository_root() -> Path:
    """The course repository: the one holding this package (an editable install), else cwd."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "solutions").is_dir() else Path.cwd()


@dataclass(frozen=True)
class Course:
    """The folders of one course: its lab sources, its releases and its grading root."""

    solutions: Path  # solutions/<lab>/*.ipynb, the lab sources with answers and hidden tests
    labs: Path  # labs/<lab>/*.ipynb, the released student versions
    grading: Path  # the nbgrader course root; never inside solutions/ or labs/

    @classmethod
    def at(cls, root: Path | str | None = None, grading: Path | str | None = None) -> Course:
        """The course of repository `root` (default: this one), graded in `grading`."""
        root = Path(root).resolve() if root is not None else repository_root()
        grading = Path(grading).resolve() if grading is not None else root / ".grading"
        return cls(solutions=root / "solutions", labs=root / "labs", grading=grading)

    @property
    def gradebook_url(self) -> str:
        return gradebook_url(self.grading)

    def lab_notebooks(self, lab: str) -> list[Path]:
        """The source notebooks of `lab`, sorted; refuses a lab folder with anything else in it.

        nbgrader copies every other file of a lab folder to the learners verbatim (a helper
        module with answers, a notebook in a subfolder with its solutions intact), so a lab
        folder holds notebooks only.
        """
        check_lab_name(lab)
        folder = self.solutions / lab
        if not folder.is_dir():
            known = sorted(p.name for p in self.solutions.glob("*") if p.is_dir())
            raise CourseError(
                f"no lab {lab!r}: {folder} does not exist. Labs here: {', '.join(known) or 'none'}."
            )
        extra = sorted(
            str(p.relative_to(folder)) for p in _files(folder) if not _is_notebook(p, folder)
        )
        if extra:
            raise CourseError(
                f"{folder} holds files other than notebooks: {', '.join(extra)}. nbgrader would "
                "copy them to learners unchanged. Move helpers into gpulab/ (checkers into "
                "gpulab/checks/) and keep only <lab>.ipynb notebooks in the lab folder."
            )
        notebooks = sorted(p for p in folder.glob("*.ipynb"))
        if not notebooks:
            raise CourseError(f"{folder} has no notebook.")
        return notebooks


def gradebook_url(grading_root: Path) -> str:
    """The SQLAlchemy URL of a grading root's gradebook."""
    return f"sqlite:///{Path(grading_root) / 'gradebook.db'}"


def check_lab_name(lab: str) -> str:
    if not LAB_NAME.match(lab):
        raise CourseError(f"{lab!r} is not a lab name (expected e.g. lab1_cuda_kernels).")
    return lab


def check_student_id(student_id: str) -> str:
    if not STUDENT_ID.match(student_id):
        raise CourseError(
            f"{student_id!r} is not a usable student id: letters, digits and _.@+- only, "
            "not starting with a dot or a dash."
        )
    return student_id


def _files(folder: Path):
    """Every file under `folder`, skipping editor and interpreter leftovers."""
    for path in sorted(folder.rglob("*")):
        if any(part in IGNORED_NAMES for part in path.relative_to(folder).parts):
            continue
        if path.is_file() or path.is_symlink():
            yield path


def _is_notebook(path: Path, folder: Path) -> bool:
    # Only top-level notebooks are nbgrader notebooks; one in a subfolder is "another file".
    return path.parent == folder and path.suffix == ".ipynb" and not path.is_symlink()


def nbgrader_config(grading_root: Path, lab: str, student_id: str = "*", **extra) -> Config:
    """nbgrader's configuration for one command on `lab`, built here and never read from disk.

    Building it in code means no nbgrader_config.py in the instructor's home or working
    directory can change how the course is graded. `extra` adds "Class.trait" settings.
    """
    config = Config()
    config.CourseDirectory.root = str(grading_root)
    config.CourseDirectory.course_id = COURSE_ID
    config.CourseDirectory.assignment_id = lab
    config.CourseDirectory.student_id = student_id
    config.CourseDirectory.db_url = gradebook_url(grading_root)
    # Released notebooks carry no run history: outputs go (ClearOutput), and so do the timing
    # fields JupyterLab records, which would make every release differ.
    config.ClearOutput.remove_metadata_fields = {
        "collapsed",
        "scrolled",
        "execution",
        "ExecuteTime",
    }
    for key, value in extra.items():
        section, trait = key.split(".")
        setattr(config[section], trait, value)
    return config


def prepare_nbgrader(log_level: int = logging.WARNING) -> None:
    """Make this process ready to call nbgrader's converters and gradebook.

    nbgrader stamps each new gradebook with the revision `alembic heads` prints, from a
    subprocess it runs by name: here the revision is read in this process instead, and the
    folder of this interpreter's scripts still goes on PATH for anything else nbgrader starts by
    name while the virtual environment is not activated (`.venv/bin/python -m autograder`). And
    nbgrader logs every file it copies at INFO: the CLI prints its own one-line summaries.
    """
    scripts = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if scripts not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, path]) if path else scripts
    for name in ("traitlets", "nbgrader"):
        logging.getLogger(name).setLevel(log_level)
    import nbgrader.api

    # The subprocess costs 3 to 10 s for every new gradebook (a grading root, a release's
    # throwaway root, each run's generated lab); the same revision, from the same scripts.
    nbgrader.api.get_alembic_version = gradebook_schema_revision
    # nbgrader's Gradebook.add_submission builds rows in a way SQLAlchemy 2 warns about at
    # every new submission; the rows are right, and the warning is noise to an instructor.
    warnings.filterwarnings("ignore", message=r".*not in session, add operation along")


@functools.cache
def gradebook_schema_revision() -> str:
    """The head revision of nbgrader's gradebook migrations (what `alembic heads` prints)."""
    import nbgrader
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()


@contextmanager
def nbgrader_log():
    """Collect what nbgrader logs (warnings and errors) while the block runs.

    nbgrader logs through traitlets' library logger, which drops everything by default.
    """
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("traitlets")
    logger.addHandler(handler)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)


def failure_cause(log_text: str) -> str | None:
    """The exception behind nbgrader's generic "see the above traceback", from its log.

    nbgrader logs the real traceback and then raises NbGraderException("Please see the above
    traceback"); what an instructor needs is the real one's last line: "DeadKernelError: ...".
    """
    causes = [
        line.strip()
        for line in log_text.splitlines()
        if EXCEPTION_LINE.match(line.strip()) and "NbGraderException" not in line
    ]
    return causes[-1] if causes else None


def run_converter(converter_class, grading_root: Path, lab: str, student_id: str, **settings):
    """Run one nbgrader converter on `lab`; its failure becomes a CourseError saying why."""
    from nbgrader.converters.base import NbGraderException
    from nbgrader.coursedir import CourseDirectory

    prepare_nbgrader()
    config = nbgrader_config(grading_root, lab, student_id, **settings)
    converter = converter_class(coursedir=CourseDirectory(config=config), config=config)
    with nbgrader_log() as log:
        try:
            converter.start()
        except NbGraderException as exc:
            cause = failure_cause(log.getvalue()) or str(exc)
            step = converter_class.__name__
            raise CourseError(f"nbgrader {step} failed on {lab}: {cause}") from exc
