"""`python -m gpulab doctor`: one readable report of what this machine can do for the course."""

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="report Python, torch, numba, CUDA, GPUs, runner and next steps")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from gpulab.doctor import report

        text, healthy = report()
        print(text)
        return 0 if healthy else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
