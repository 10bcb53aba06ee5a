"""How long `make test` takes: the instructors' CI runs it on every change, on small machines.

    make test wall time    read from benchmarks/results/make-test.json, which the last `make test`
                           on this machine wrote (the whole suite, with its nbval lessons); target:
                           under 20 minutes on a 2-core machine, from a fresh clone

Running the suite here would take as long as the suite, so this reports the last run instead,
with its date, commit, core count and exit status; a run limited by PYTEST_ARGS is reported
as such and has no target.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import Row

RECORD = Path(__file__).resolve().parent / "results" / "make-test.json"
TARGET_MIN = 20.0


def run(quick: bool = False) -> list[Row]:
    if not RECORD.is_file():
        return [Row("suite", "make test wall time", float("nan"), "min", f"< {TARGET_MIN:g} min",
                    None, "no record yet: run `make test` on this machine first")]
    last = json.loads(RECORD.read_text())
    minutes = last["seconds"] / 60
    whole = not last.get("args", "").strip()
    note = (f"last run {last['date']}, commit {last['commit']}, {last['cores']} cores, "
            f"exit {last['exit']}" + ("" if whole else f", limited by {last['args']!r}"))
    return [Row("suite", "make test wall time", minutes, "min",
                f"< {TARGET_MIN:g} min" if whole else "",
                (minutes < TARGET_MIN and last["exit"] == 0) if whole else None, note)]
