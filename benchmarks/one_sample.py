"""Seconds for one sample per scorer on this machine, at the scorers' default settings and at smaller settings.

    python -m benchmarks.one_sample [--model PATH] [--out benchmarks/results/one_sample_cpu.json]

One process, one loaded judge; prints a markdown table, writes JSON, and prints the JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from offline_sumscore import SummarizationScorer, SummaryScore, load_judge

SOURCE = (
    "The city council of Lindford voted on Tuesday to build a new public library on Mill Street. "
    "Construction will begin in March and cost 4 million pounds. The library will have a children's wing "
    "and a cafe, and the council expects it to open in two years."
)
SUMMARY = "Lindford's council voted to build a 4 million pound library on Mill Street, with work starting in March."

SETTINGS = {
    ("two-axis", "defaults"): (SummarizationScorer, {}),
    ("two-axis", "yes-no verdicts with reasons, questions"): (
        SummarizationScorer,
        dict(
            claims="sentences",
            coverage="questions",
            verdicts="yes-no",
            max_questions=3,
            max_text_chars=100,
            max_reason_chars=80,
        ),
    ),
    ("summary-score", "defaults"): (SummaryScore, {}),
    ("summary-score", "demo caps"): (SummaryScore, dict(max_questions=3, max_keyphrases=6, max_text_chars=100)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default="benchmarks/results/one_sample_cpu.json")
    args = ap.parse_args()
    started = time.perf_counter()
    judge = load_judge(args.model)
    rows = [{"stage": "load judge", "seconds": round(time.perf_counter() - started, 2)}]
    for (metric, label), (cls, kw) in SETTINGS.items():
        scorer = cls(judge, **kw)
        t = time.perf_counter()
        r = scorer.score(SOURCE, SUMMARY)
        rows.append(
            {
                "metric": metric,
                "settings": label,
                "seconds": round(time.perf_counter() - t, 2),
                "score": r.score,
                "tokens_in": sum(s["tokens_in"] for s in r.stages.values()),
                "tokens_out": sum(s["tokens_out"] for s in r.stages.values()),
                "per_stage_seconds": {k: s["seconds"] for k, s in r.stages.items()},
            }
        )
    report = {
        "judge": judge.describe(),
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "rows": rows,
    }
    print("| metric | settings | seconds | tokens in | tokens out |\n|---|---|---|---|---|")
    for row in rows[1:]:
        print(f"| {row['metric']} | {row['settings']} | {row['seconds']} | {row['tokens_in']} | {row['tokens_out']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
