"""Run every benchmarks/bench_*.py and print one table (`make bench`).

    python benchmarks/run.py            # all of them
    python benchmarks/run.py --quick    # smaller sizes, for a smoke test
    python benchmarks/run.py kernels    # only bench_kernels.py

Exits 1 when a benchmark crashes; a missed target is reported in the table, not as a failure,
because figures vary with the machine and are for people to read.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Row  # noqa: E402

HEADER = ["benchmark", "metric", "value", "target", "status", "note"]


def discover(names: list[str]) -> list[Path]:
    files = sorted(HERE.glob("bench_*.py"))
    if names:
        files = [f for f in files if f.stem.removeprefix("bench_") in names]
    return files


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there as it is defined
    spec.loader.exec_module(module)
    return module


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="topics to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke tests")
    args = parser.parse_args(argv)
    import gpulab  # decide the runner before any benchmark imports numba.cuda

    print(f"runner: {gpulab.runner.name}, device: {gpulab.runner.device_kind}", flush=True)
    rows: list[Row] = []
    crashed = []
    for path in discover(args.names):
        print(f"running {path.name} ...", flush=True)
        try:
            rows.extend(load(path).run(quick=args.quick))
        except Exception:
            crashed.append(path.name)
            traceback.print_exc()
    print()
    print(table([HEADER] + [r.cells() for r in rows]) if rows else "no benchmark rows")
    if crashed:
        print(f"\ncrashed: {', '.join(crashed)}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
