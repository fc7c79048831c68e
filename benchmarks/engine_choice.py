"""The table a CPU user reads to pick an engine, written again into benchmarks/results/throughput_cpu.md from the
results files beside it (benchmarks/lib/engine_choice.py says what it reads).

    python -m benchmarks.engine_choice [--results benchmarks/results]

The cpu ladder writes it there itself; run this after another judge's ladder (`--model qwen2.5-coder-1.5b`) or a
memory run (`python -m benchmarks.memory_peak`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.lib.engine_choice import rewrite, section
from benchmarks.lib.ladder_report import RESULTS


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: %(default)s)")
    args = parser.parse_args(argv)
    rewrite(args.results / "throughput_cpu.md", args.results)
    print(section(args.results))


if __name__ == "__main__":
    main()
