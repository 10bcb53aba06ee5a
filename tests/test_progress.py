"""gpulab.progress: a lab's visible checks, part by part, on the learner's own definitions.

Each lab's parts table (the ASSIGNMENT in its gpulab/checks/labN package) is compared with the
visible half of every test cell of every solutions/lab*/ notebook, so the two cannot drift. The
runs use the cheap parts (Lab 1's waves, Lab 2's to_device, Lab 5's 1F1B order) with the
solution's own cells (pass), the released stubs (not started) and known-wrong answers (fail
with the checker's teaching message).
"""

import ast
import re
import subprocess
import sys

import pytest
from lab_submissions import ROOT, cell_by_grade_id, grade_id, points_of, read

import gpulab
from gpulab.checks import assignment, find_parts, package
from gpulab.checks.table import Answer, Check
from gpulab.self_check import (
    FAIL,
    NOT_DEFINED,
    NOT_STARTED,
    PASS,
    check_part,
    progress,
    run_self_checks,
)

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)
SOLUTIONS = sorted(ROOT.glob("solutions/lab*/lab*.ipynb"))
PRELUDE = {  # the imports that the answer cells below lean on, from each lab's first cells
    "lab1_cuda_kernels": "import math\nfrom numba import cuda\n"
                         "from gpulab.hardware import get_gpu\n",
    "lab2_amp_training": "import torch\n",
    "lab3_ddp_from_scratch": "import torch\nimport torch.nn as nn\n",
    "lab5_parallelism_across_nodes": "import torch\nimport torch.nn as nn\n",
}


def visible_checks(source: str) -> tuple[Check, ...]:
    """The checker calls of a test cell's visible half: checker(learner names..., literals)."""
    tree = ast.parse(HIDDEN.sub("", source))
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) and node.func.id.startswith("check_")),
                   key=lambda node: (node.lineno, node.col_offset))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module.startswith("gpulab.checks.lab") for alias in node.names}
    checks = []
    for call in calls:
        assert call.func.id in imported, f"{call.func.id} is not imported from its lab's checks"
        assert all(isinstance(arg, ast.Name) for arg in call.args), ast.unparse(call)
        checks.append(Check(call.func.id, tuple(arg.id for arg in call.args),
                            {kw.arg: _literal(kw.value) for kw in call.keywords}))
    return tuple(checks)


def _literal(node):
    """A keyword's value: a literal, or Answer(name) for answer_key("name") (keys.py)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "answer_key":
        return Answer(ast.literal_eval(node.args[0]))
    return ast.literal_eval(node)


def lab_namespace(lab: str, cells: dict[str, str | None], released: bool = False) -> dict:
    """A notebook's namespace after running the answer cells named in `cells` (grade_id ->
    None for the cell as it is, or (old, new) to break it), from the solution or the release."""
    folder = "labs" if released else "solutions"
    nb = read(ROOT / folder / lab / f"{lab}.ipynb")
    namespace: dict = {}
    exec(PRELUDE.get(lab, ""), namespace)
    for cell_id, change in cells.items():
        source = cell_by_grade_id(nb, cell_id).source
        if change is not None:
            assert source.count(change[0]) == 1, f"{change[0]!r} changed in {cell_id}"
            source = source.replace(*change)
        try:
            exec(compile(source, f"<cell {cell_id}>", "exec"), namespace)
        except NotImplementedError:  # a released stub cell that raises at its end
            pass
    return namespace


# ----------------------------------------------------------------------------- the parts table


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.parent.name)
def test_parts_match_the_visible_test_cells(path):
    nb = read(path)
    points = points_of(nb)
    parts = {part.grade_id: part for part in assignment(path.stem).parts}
    assert set(parts) == set(points), "a test cell was added or removed: update the table"
    for cell in nb.cells:
        if grade_id(cell) in parts:
            part = parts[grade_id(cell)]
            assert part.points == points[part.grade_id], part.grade_id
            assert part.checks == visible_checks(cell.source), (
                f"{part.grade_id}: the table no longer calls what the visible test cell calls")
            for check in part.checks:
                assert callable(getattr(package(path.stem), check.checker))


def test_a_changed_visible_call_is_noticed():
    nb = read(ROOT / "solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb")
    source = cell_by_grade_id(nb, "test_saxpy").source
    (part,) = find_parts("lab1", "saxpy")
    assert visible_checks(source) == part.checks
    assert visible_checks(source.replace("sizes=[2048, 5000]", "sizes=[2048]")) != part.checks
    hidden_only = source.replace("check_saxpy(saxpy, sizes=[2048, 5000])\n", "")
    assert visible_checks(hidden_only) == ()  # the hidden call is not counted as visible


def test_every_lab_has_parts():
    assert all(assignment(path.stem).parts for path in SOLUTIONS)


def test_hidden_tests_are_not_among_the_visible_checks():
    cell = cell_by_grade_id(read(ROOT / "solutions/lab1_cuda_kernels/lab1_cuda_kernels.ipynb"),
                            "test_saxpy")
    assert "seed=3" in cell.source  # the hidden call is in the cell, not among the parts
    assert all("seed" not in c.kwargs for c in find_parts("lab1", "saxpy")[0].checks)


def test_labs_and_parts_by_short_names():
    assert find_parts("lab5", "one_f_one_b") == find_parts("lab5_parallelism_across_nodes",
                                                           "test_one_f_one_b")
    assert [p.name for p in find_parts(1)][:3] == ["saxpy", "block_sum", "block_sum_technique"]
    with pytest.raises(ValueError, match="lab1_cuda_kernels"):
        find_parts("lab9")
    with pytest.raises(ValueError, match="saxpy, block_sum, block_sum_technique"):
        find_parts("lab1", "sxapy")


# ----------------------------------------------------------------------------- running parts


def test_the_solutions_pass():
    lab1 = lab_namespace("lab1_cuda_kernels", {"waves": None})
    lab2 = lab_namespace("lab2_amp_training", {"to_device": None})
    lab5 = lab_namespace("lab5_parallelism_across_nodes", {"one_f_one_b": None})
    for lab, part, namespace in (("lab1", "waves", lab1), ("lab2", "to_device", lab2),
                                 ("lab5", "one_f_one_b", lab5)):
        report = run_self_checks(lab, part, namespace=namespace, progress=False)
        assert [r.status for r in report.results] == [PASS], str(report)
        assert report.points_passed == report.points_total > 0


def test_the_released_stubs_read_not_started():
    lab1 = lab_namespace("lab1_cuda_kernels", {"waves": None, "saxpy": None}, released=True)
    for part, says in (("waves", "Still None: threads_per_block, blocks, blocks_per_sm, n_waves."),
                       ("saxpy", "Still `raise NotImplementedError()`: saxpy.")):
        (result,) = run_self_checks("lab1", part, namespace=lab1, progress=False).results
        assert result.status == NOT_STARTED and says in result.message, result
    # Classes: the methods still to write are named; no process starts for them.
    lab3 = lab_namespace("lab3_ddp_from_scratch", {"simple_ddp": None}, released=True)
    (result,) = run_self_checks("lab3", "simple_ddp", namespace=lab3, progress=False).results
    assert result.status == NOT_STARTED
    assert "SimpleDDP.__init__" in result.message and "finish_gradient_sync" in result.message
    assert "forward" not in result.message  # given ready-made in the release
    lab5 = lab_namespace("lab5_parallelism_across_nodes", {"tp_linear": None}, released=True)
    (result,) = run_self_checks("lab5", "tp_linear", namespace=lab5, progress=False).results
    assert result.status == NOT_STARTED and "CopyToTP.backward" in result.message
    assert "and 4 more" in result.message  # 8 stub methods: the first 4 named


def test_a_missing_definition_says_which_cell_to_run():
    report = run_self_checks("lab2", namespace={}, progress=False)
    assert {r.status for r in report.results} == {NOT_DEFINED}
    resume = next(r for r in report.results if r.part == "resume")
    assert "snapshot, restore not defined yet" in resume.message


WRONG = [  # (lab, part, answer cell, (solution text, wrong text), the checker's teaching)
    ("lab5_parallelism_across_nodes", "one_f_one_b", "one_f_one_b",
     ("warmup = min(p - stage - 1, m)", "warmup = m"), r"That is GPipe"),
    ("lab1_cuda_kernels", "waves", "waves",
     ("math.ceil(grid / (l4.sms * per_sm))", "grid / (l4.sms * per_sm)"),
     r"The GPU runs whole waves: round up"),
    ("lab2_amp_training", "to_device", "to_device",
     ("batch.to(device, non_blocking=True)", "batch.to(device)"), r"non_blocking=True"),
]


@pytest.mark.parametrize("lab, part, cell, change, teaching", WRONG, ids=[w[1] for w in WRONG])
def test_a_wrong_answer_fails_with_the_checkers_message(lab, part, cell, change, teaching):
    namespace = lab_namespace(lab, {cell: change})
    (result,) = run_self_checks(lab, part, namespace=namespace, progress=False).results
    assert result.status == FAIL and re.search(teaching, result.message), result


def test_a_crash_in_the_learners_code_is_reported_not_raised():
    def one_f_one_b_stage(p, m, stage):
        return [("F", i) for i in range(m // (stage - stage))]  # ZeroDivisionError

    (part,) = find_parts("lab5", "one_f_one_b")
    result = check_part(part, {"one_f_one_b_stage": one_f_one_b_stage}, "lab5")
    assert result.status == FAIL and "ZeroDivisionError" in result.message, result


# ----------------------------------------------------------------------------- what it shows


def test_progress_prints_a_table_and_a_bar_that_can_be_turned_off(capsys):
    namespace = lab_namespace("lab5_parallelism_across_nodes", {"one_f_one_b": None})
    progress("lab5", namespace=namespace)
    shown = capsys.readouterr()
    assert "1 of 7 parts pass" in shown.out and re.search(r"one_f_one_b\s+4\s+pass", shown.out)
    assert re.search(r"tp_linear\s+3?4\s+not defined", shown.out)
    assert "part/s" in shown.err  # tqdm's bar, on stderr
    progress("lab5", part="one_f_one_b", namespace=namespace, progress=False)
    shown = capsys.readouterr()
    assert "1 of 1 parts pass" in shown.out and shown.err == ""


def test_progress_stands_aside_while_grading(capsys, monkeypatch):
    from autograder.profiles import get_profile
    from autograder.sandbox_kernel import kernel_environment

    for runner in ("cpu", "gpu"):  # the grading kernel gets the variable, through the sandbox
        env = kernel_environment(get_profile(runner).kernel_env({}), "/home/learner", "/tmp")
        assert env["GPULAB_GRADING"] == "1"
    monkeypatch.setenv("GPULAB_GRADING", "1")
    progress("lab5", namespace={"one_f_one_b_stage": None})
    shown = capsys.readouterr()
    assert "skipped while grading" in shown.out and "one_f_one_b" not in shown.out + shown.err


def test_report_as_html_escapes_the_message():
    namespace = lab_namespace("lab1_cuda_kernels", {"waves": None}, released=True)
    report = run_self_checks("lab1", "waves", namespace=namespace, progress=False)
    page = report._repr_html_()
    assert "<table>" in page and "not started" in page and "<code>waves</code>" in page


NOTEBOOK = """
import gpulab
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell('''import gpulab
def one_f_one_b_stage(p, m, stage):
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]''')
shell.run_cell('gpulab.progress("lab5", part="one_f_one_b", progress=False)')
"""


def test_progress_reads_the_notebooks_own_definitions():
    # An IPython shell of its own process: the notebook's namespace is the shell's user_ns.
    run = subprocess.run([sys.executable, "-c", NOTEBOOK], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "0 of 1 parts pass" in run.stdout and "That is GPipe" in run.stdout, run.stdout


SCRIPT = """
import gpulab
def one_f_one_b_stage(p, m, stage):
    return [x for i in range(m) for x in (("F", i), ("B", i))]
gpulab.progress("lab5", part="one_f_one_b", progress=False)
"""


def test_progress_in_a_script_reads_the_scripts_globals():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert re.search(r"one_f_one_b\s+4\s+fail", run.stdout), run.stdout


def test_gpulab_progress_loads_neither_torch_nor_numba_cuda():
    code = ("import sys, gpulab; before = set(sys.modules); gpulab.progress; "
            "print(sorted(m for m in set(sys.modules) - before "
            "if m.split('.')[0] in ('torch', 'numba')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr
    assert gpulab.progress is progress
