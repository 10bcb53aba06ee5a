"""Capstone, Part 5: a hang diagnosed from the launcher's report (check_hang_diagnosis).

The hang is real: gpulab.capstone.hang plants it on a run_on_ranks launch (one rank skips one
collective of a step) and hands the learner's function the LaunchTimeout's text. Which rank and
which collective come from the learner's id; in grading, from the id the notebook was handed in
under, drawn outside the learner's kernel (ANSWERS["hang"]).
"""

from __future__ import annotations

from gpulab.capstone.hang import COLLECTIVES, PlantedHang, hang_for, hub_user, plant
from gpulab.checks.capstone.common import require_learner_code


def check_hang_diagnosis(diagnose_hang, planted: dict | None = None) -> None:
    """Plant `planted` (default: this learner's own hang), give diagnose_hang the launcher's
    report, and compare its (rank, collective) with what was planted."""
    require_learner_code(diagnose_hang, "diagnose_hang")
    hang = PlantedHang(**planted) if planted is not None else hang_for(hub_user())
    report = plant(hang)
    try:
        answer = diagnose_hang(report)
    except Exception as error:  # noqa: BLE001 - the learner's parsing failed on a real report
        raise AssertionError(f"diagnose_hang raised {type(error).__name__}: {error}\non this "
                             f"report of a real hang:\n{_rank_lines(report)}") from None
    rank, collective = _as_rank_and_collective(answer)
    print(f"a hang on {hang.world_size} ranks; diagnose_hang says rank {rank} never called "
          f"{collective}")
    waiting_there = [r for r in range(hang.world_size) if r != hang.skipper]
    if rank in waiting_there:
        raise AssertionError(
            f"rank {rank} is one of the ranks waiting in {hang.missing}: it made the call and "
            "waits for the rank that never did, so it is not the one to blame, however long "
            "it waited or wherever the report lists it. Name the rank that is not waiting "
            f"where the others are.\n{_rank_lines(report)}")
    if rank != hang.skipper:
        raise AssertionError(f"rank {rank}: the report shows ranks 0 to {hang.world_size - 1}."
                             f"\n{_rank_lines(report)}")
    if collective != hang.missing:
        went_on = _next_after(hang.missing)
        why = (f"{collective} is where rank {rank} waits: it walked past the call it skipped "
               "into the next one, where it waits alone." if collective == went_on else
               f"no rank is stuck because of {collective}.")
        raise AssertionError(f"{why} The missing collective is the one the other ranks wait "
                             f"in.\n{_rank_lines(report)}")


def _as_rank_and_collective(answer) -> tuple[int, str]:
    if (not isinstance(answer, (tuple, list)) or len(answer) != 2
            or isinstance(answer[0], bool) or not isinstance(answer[0], int)
            or not isinstance(answer[1], str)):
        raise AssertionError(f"diagnose_hang returned {answer!r}: return a (rank, collective) "
                             'pair, such as (2, "all_reduce"): an int and the name the report '
                             "gives the collective.")
    name = answer[1].strip().removeprefix("torch.distributed.").removeprefix("dist.")
    return answer[0], name.removesuffix("()")


def _next_after(missing: str) -> str | None:
    at = COLLECTIVES.index(missing)
    return COLLECTIVES[at + 1] if at + 1 < len(COLLECTIVES) else None


def _rank_lines(report: str) -> str:
    """The report's lines about where the ranks were (its stacks left out)."""
    keep = [line for line in report.splitlines()
            if line.startswith(("  rank ", "Finished:", "Still running"))]
    return "The report said:\n" + "\n".join(keep)
