"""Two runs' OUTPUT rows compared: what must be equal between runs of the same work, and which verdicts moved.

Used by the determinism and resume tests and by the kill-resume and soak benchmarks, and to check that a change of
code left the rows as they were (`python -m benchmarks.lib.row_diff A.jsonl B.jsonl`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Fields that may differ between two runs of the same work: wall times, whether a stage was answered from the cache,
# how many requests reached the engine together with it (in a stream that depends on the company a row runs in, e.g.
# one process against a pool of workers), and the engine's sizing where it was taken from the memory free when the
# engine started (its KV token budget, the prefix store's share of it, and the sentence that says so), and when the
# run that wrote a row started and wrote it ("timing"). Rows keep them for audit; a row's verdicts must not depend on
# them (the Ray tests hold them exact).
TIMING_FIELDS = ("seconds", "cached", "batch_size", "token_budget", "prefix_store", "capacity", "timing")


def without_timing(rows: list) -> list:
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMING_FIELDS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return [strip(r) for r in rows]


def verdict_flips(got: list[dict], expected: list[dict]) -> tuple[int, int]:
    """Two-axis verdicts that differ between two runs of the same rows, and how many verdicts there are."""
    flips = total = 0
    for a, b in zip(got, expected, strict=True):
        va = [c["supported"] for c in a["claims"]] + [v["answered"] for v in a["coverage_verdicts"]]
        vb = [c["supported"] for c in b["claims"]] + [v["answered"] for v in b["coverage_verdicts"]]
        flips += sum(x != y for x, y in zip(va, vb)) + abs(len(va) - len(vb))
        total += max(len(va), len(vb))
    return flips, total


def differing_rows(a: list[dict], b: list[dict]) -> list[int]:
    """Positions of rows that differ, timing fields aside (a missing row counts as differing)."""
    a, b = without_timing(a), without_timing(b)
    return [i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.lib.row_diff A.jsonl B.jsonl", file=sys.stderr)
        return 2
    a, b = (
        [json.loads(line) for line in Path(p).read_text(encoding="utf-8").splitlines() if line.strip()] for p in argv
    )
    differ = differing_rows(a, b)
    print(f"{len(a)} and {len(b)} rows; {len(differ)} differ timing aside" + (f": rows {differ}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
