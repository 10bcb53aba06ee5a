"""`grade --shard i/n` and `merge`: a class graded in two shards, each into its own grading root,
then merged, is the class graded in one root: same gradebook, same export, same feedback.

The merge rules (conflicts, unfinished records, a lab graded from two sources, flags in the
export) are tested on grading roots filled with made-up results, without a kernel; the
end-to-end test grades four fixture-lab submissions twice (once whole, once in two shards).
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.cli import main
from autograder.course import COURSE_ID, Course, CourseError, gradebook_url
from autograder.export import NOT_RECORDED, rows
from autograder.gradebook import record, record_path
from autograder.release import generate_assignment
from autograder.shards import Shard, merge, shard_of
from autograder.worker import CellScore, GradeResult

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "solutions"
LAB = "lab0_fixture"
NOTEBOOK = f"{LAB}.ipynb"
POINTS = {"test_mean": 2.0, "test_running_max": 3.0}  # the fixture lab's graded cells


def cli(argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def cell_scores(grading: Path) -> dict:
    with Gradebook(gradebook_url(grading), COURSE_ID) as gradebook:
        return {
            (a.name, s.student.id): {g.name: g.auto_score for nb in s.notebooks for g in nb.grades}
            for a in gradebook.assignments for s in a.submissions
        }


# --- shards ------------------------------------------------------------------------------------

def test_every_student_is_in_exactly_one_shard_and_every_runner_agrees():
    ids = [f"student{i:03d}" for i in range(300)]
    for count in (1, 2, 3):
        shards = [Shard(i, count) for i in range(1, count + 1)]
        sizes = [sum(shard.includes(s) for s in ids) for shard in shards]
        assert all(sum(shard.includes(s) for shard in shards) == 1 for s in ids)
        assert min(sizes) > len(ids) / count / 2, f"unbalanced shards: {sizes}"
    # Another process, with another hash seed (a CI runner): the same shards.
    script = "import sys\nfrom autograder.shards import shard_of\n" \
             "print([shard_of(s, 3) for s in sys.argv[1:]])"
    other = subprocess.run([sys.executable, "-c", script, *ids], cwd=REPO, check=True, text=True,
                           capture_output=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == str([shard_of(s, 3) for s in ids])


def test_a_shard_is_written_i_slash_n():
    assert Shard.parse("2/3") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    for bad in ("0/2", "3/2", "1/0", "a/b", "1", "-1/2"):
        with pytest.raises(CourseError, match="i/n"):
            Shard.parse(bad)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        main(["grade", LAB, "--shard", "3/2"])


# --- merging, on made-up results ---------------------------------------------------------------

def made_up_root(path: Path, grades: dict[str, dict[str, float]], source=FIXTURE) -> Path:
    """A grading root with the fixture lab and, per student, a recorded result with `grades`
    (grade_id -> points); the "executed" notebook is the source notebook."""
    shutil.copytree(source / LAB, path / "source" / LAB)
    generate_assignment(path, LAB)
    for student, points in grades.items():
        executed = path.parent / f"{path.name}-{student}-run"
        executed.mkdir()
        shutil.copyfile(source / LAB / NOTEBOOK, executed / NOTEBOOK)
        scores = tuple(CellScore(LAB, grade_id, points[grade_id], top, False)
                       for grade_id, top in sorted(POINTS.items()))
        record(path, GradeResult(LAB, student, scores=scores, autograded=str(executed)),
               fingerprint=f"made-up {student}")
    return path


@pytest.mark.slow  # a few nbgrader gradebooks: seconds each
def test_merging_agrees_with_the_roots_and_carries_flags_and_manual_scores(tmp_path):
    first = made_up_root(tmp_path / "a", {"ada": {"test_mean": 2, "test_running_max": 0}})
    second = made_up_root(tmp_path / "b", {"bob": {"test_mean": 0, "test_running_max": 3},
                                           "ada": {"test_mean": 2, "test_running_max": 0}})
    path = record_path(second, LAB, "bob")  # a flag, as the integrity checks raise them
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "result": {**data["result"], "flags": ["x", "y"]}}))
    with Gradebook(gradebook_url(second), COURSE_ID) as gradebook:  # a person gave bob a point
        grade = gradebook.find_grade("test_mean", LAB, LAB, "bob")
        grade.manual_score = 1.0
        gradebook.db.commit()

    merged = merge([first, second], tmp_path / "merged")  # ada is in both, with equal grades
    assert merged == [(LAB, "ada"), (LAB, "bob")]
    table = {row.student_id: row for row in rows(Course.at(REPO, tmp_path / "merged"))}
    assert (table["ada"].score, table["bob"].score) == (2, 4)
    assert table["bob"].flags == ("x", "y") and table["ada"].flags == ()
    assert (tmp_path / "merged" / "autograded" / "bob" / LAB / NOTEBOOK).is_file()
    assert (tmp_path / "merged" / "source" / LAB / NOTEBOOK).is_file()
    assert not list(tmp_path.glob(".merged*")), "nothing left of the merge's work"


@pytest.mark.slow  # a few nbgrader gradebooks: seconds each
def test_a_merge_with_conflicts_writes_nothing_and_says_why(tmp_path):
    first = made_up_root(tmp_path / "a", {"ada": {"test_mean": 2, "test_running_max": 0}})
    second = made_up_root(tmp_path / "b", {"ada": {"test_mean": 2, "test_running_max": 3},
                                           "bob": {"test_mean": 0, "test_running_max": 3}})
    record_path(second, LAB, "bob").unlink()  # as a run killed while recording bob leaves it
    changed = tmp_path / "changed"
    shutil.copytree(FIXTURE, changed)
    nb = nbformat.read(changed / LAB / NOTEBOOK, as_version=4)
    nb.cells[0].source += "\n\nA fixed typo."
    nbformat.write(nb, changed / LAB / NOTEBOOK)
    third = made_up_root(tmp_path / "c", {"cy": {"test_mean": 2, "test_running_max": 3}},
                         source=changed)
    with pytest.raises(CourseError) as error:
        merge([first, second, third], tmp_path / "merged")
    message = str(error.value)
    assert "ada's lab0_fixture has different grades" in message and "(2 / 5)" in message
    assert "bob's lab0_fixture is in the gradebook without a record" in message
    assert f"graded from different sources in {first} and {third}" in message
    assert not (tmp_path / "merged").exists()
    flags = {row.student_id: row.flags for row in rows(Course.at(REPO, second))}
    assert flags == {"ada": (), "bob": (NOT_RECORDED,)}, "the export flags the unfinished one"

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("an instructor's file")
    with pytest.raises(CourseError, match="not empty"):
        merge([first], tmp_path / "full")
    with pytest.raises(CourseError, match="apart from the roots"):
        merge([first], first / "merged")
    with pytest.raises(CourseError, match="no gradebook.db"):
        merge([tmp_path / "full"], tmp_path / "merged")


# --- end to end: two shards on one machine -----------------------------------------------------

STUDENTS = ("ada", "bob", "cy", "dee")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(FIXTURE, root / "solutions")
    solution = nbformat.read(root / "solutions" / LAB / NOTEBOOK, as_version=4)
    for student in STUDENTS:
        nb = nbformat.from_dict(solution)
        mean = next(c for c in nb.cells if c.get("id") == "mean")
        if student in ("bob", "dee"):  # two wrong means, so the shards' grades differ
            mean.source = mean.source.replace("return sum(xs) / len(xs)", "return xs[-1]")
        (root / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, root / "subs" / student / NOTEBOOK)
    subs, common = str(root / "subs"), ["--root", str(root)]
    whole, first, second = root / "whole", root / "shard-1", root / "shard-2"
    runs = [cli(["grade", LAB, subs, *common, "--course-dir", str(whole)])]
    for shard, folder in (("1/2", first), ("2/2", second)):
        runs.append(cli(["grade", LAB, subs, *common, "--course-dir", str(folder),
                         "--shard", shard, "--jobs", "2"]))
    assert [code for code, _ in runs] == [0, 0, 0], runs
    return root, whole, first, second


@pytest.mark.slow
def test_each_shard_grades_its_own_students(graded):
    root, whole, first, second = graded
    in_first = {s for s in STUDENTS if Shard(1, 2).includes(s)}
    assert 0 < len(in_first) < len(STUDENTS), "both shards must hold students for this test"
    assert {s for _, s in cell_scores(first)} == in_first
    assert {s for _, s in cell_scores(second)} == set(STUDENTS) - in_first
    assert not (first / "submitted" / sorted(set(STUDENTS) - in_first)[0]).exists()


@pytest.mark.slow
def test_merged_shards_are_the_class_graded_in_one_root(graded):
    root, whole, first, second = graded
    merged = root / "merged"
    code, out = cli(["merge", str(first), str(second), "--into", str(merged)])
    assert code == 0 and "merged 4 graded submissions of 4 students" in out, out
    assert cell_scores(merged) == cell_scores(whole)
    exported = {}
    for name, folder in (("merged", merged), ("whole", whole)):
        csv_path = root / f"{name}.csv"
        assert cli(["export", "--root", str(root), "--course-dir", str(folder),
                    "--output", str(csv_path)])[0] == 0
        exported[name] = csv_path.read_text()
    assert exported["merged"] == exported["whole"]
    assert len(exported["merged"].splitlines()) == 1 + len(STUDENTS)
    for folder in (merged, whole):
        assert cli(["feedback", LAB, "--root", str(root), "--course-dir", str(folder)])[0] == 0
    for student in STUDENTS:
        page = f"feedback/{student}/{LAB}/{LAB}.html"
        assert (merged / page).read_text() == (whole / page).read_text(), student
    # A merged root is a grading root like any other: grading the class there changes nothing.
    code, out = cli(["grade", LAB, str(root / "subs"), "--root", str(root),
                     "--course-dir", str(merged)])
    assert code == 0 and out.count("(already graded)") == len(STUDENTS), out
