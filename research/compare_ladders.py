"""Ladder runs side by side: before and after a change that must not move verdicts.

    python -m research.compare_ladders BEFORE AFTER        # each the --out stem of a throughput.py run
    python -m research.compare_ladders B1,B2,B3 A1,A2,A3   # several runs a side, e.g. taken in turns

Per workload and rung: each side's median time over all its runs (every run listed), after/before, each side's
median x rung 0 (the naive loop's time over the rung's, per sample, taken side by side within each run), verdicts that
differ between the sides' first runs (flips), the largest change of a verdict's probability and of a score, and rows
that failed on one side only. A row-for-row comparison, not a rate: every run scores the same frozen inputs. Taking
the runs of the two sides in turns puts a slow spell of the machine on both alike. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median


def load(stems: str) -> tuple[dict, dict, dict]:
    """Every run's times per (workload, rung), pooled; each run's rung-0 time over the rung's (its x rung 0, taken
    side by side in that run), pooled; and the first run's outcomes."""
    times: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    outcomes = None
    for stem in stems.split(","):
        report = json.loads(Path(f"{stem}.json").read_text())
        naive = {r["workload"]: median(r["runs_s"]) for r in report["rows"] if r["rung"] == "0"}
        for r in report["rows"]:
            times.setdefault((r["workload"], r["rung"]), []).extend(r["runs_s"])
            if r["workload"] in naive:
                per_sample = r["samples"] / next(
                    x["samples"] for x in report["rows"] if x["workload"] == r["workload"] and x["rung"] == "0"
                )
                ratios.setdefault((r["workload"], r["rung"]), []).append(
                    naive[r["workload"]] * per_sample / median(r["runs_s"])
                )
        outcomes = outcomes or json.loads(Path(f"{stem}_verdicts.json").read_text())
    return times, ratios, outcomes


def differences(before: list[dict], after: list[dict]) -> dict:
    """Flips, compared verdicts, the largest probability and score changes, and rows failed in one run only."""
    flips = compared = failed_once = 0
    p_change = score_change = 0.0
    for a, b in zip(before, after, strict=True):
        if ("error" in a) != ("error" in b):
            failed_once += 1
            continue
        if "error" in a:
            continue
        compared += max(len(a["verdicts"]), len(b["verdicts"]))
        flips += sum(x != y for x, y in zip(a["verdicts"], b["verdicts"])) + abs(
            len(a["verdicts"]) - len(b["verdicts"])
        )
        for x, y in zip(a["p"], b["p"]):
            if x is not None and y is not None:
                p_change = max(p_change, abs(x - y))
        score_change = max(score_change, abs(a["score"] - b["score"]))
    return dict(flips=flips, compared=compared, p_change=p_change, score_change=score_change, failed_once=failed_once)


def ratio(ratios: dict, key) -> str:
    return f"{median(ratios[key]):.2f}" if key in ratios else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description="Two ladder runs, before and after a change (see the docstring).")
    ap.add_argument("before", help="the --out stem of a throughput.py run, or several joined by commas")
    ap.add_argument("after", help="the same for the runs after the change")
    args = ap.parse_args()
    times_a, ratios_a, outcomes_a = load(args.before)
    times_b, ratios_b, outcomes_b = load(args.after)
    lines = [
        "| workload | rung | before s (runs) | after s (runs) | after / before | x rung 0 before | x rung 0 after "
        "| flips | max P change | max score change | failed in one run |",
        "|" + "---|" * 11,
    ]
    for key, a in times_a.items():
        b = times_b.get(key)
        if b is None:
            continue
        workload, rung = key
        d = differences(outcomes_a[workload][rung], outcomes_b[workload][rung])
        lines.append(
            f"| {workload} | {rung} | {median(a):.1f} ({', '.join(f'{x:.1f}' for x in a)}) | "
            f"{median(b):.1f} ({', '.join(f'{x:.1f}' for x in b)}) | {median(b) / median(a):.2f} | "
            f"{ratio(ratios_a, key)} | {ratio(ratios_b, key)} | "
            f"{d['flips']} of {d['compared']} | {d['p_change']:.1e} | {d['score_change']:.1e} | {d['failed_once']} |"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
