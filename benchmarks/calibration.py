"""Calibration across kinds of text: does a threshold chosen on one collection hold on another?

    python -m benchmarks.calibration --data DATA/frank_finesure_gpt4o.jsonl
        # FRANK: CNN/DM (near-extractive) and BBC/XSum (abstractive)

Each FRANK summary is labelled consistent when its annotators found no error in it (human.summary_has_error == 0).
Every summary is scored once by the embedded judge at its likelihood design (as `sumscore calibrate` scores); each
row's value is its lowest claim PMI. Per collection: the threshold `sumscore calibrate` would choose there, with
its bootstrap intervals (documents resampled); then each collection's threshold applied to the other collection,
and the 2.0-nat default applied to both, as balanced accuracy with a bootstrap interval. Writes
benchmarks/results/calibration_frank.{md,json}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.agreement_stats import balanced_accuracy, with_interval
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.analysis.calibration import calibrate
from offline_sumscore.scorers.stages.verdict import LIKELIHOOD_THRESHOLD

HERE = Path(__file__).resolve().parent
PARTS = {"cnndm": "CNN/DM", "bbc": "BBC/XSum"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="FRANK's agreement file (frank_finesure_gpt4o.jsonl)")
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    items = [json.loads(line) for line in args.data.open()]
    judge = load_judge("smollm2-135m")
    scorer = SummarizationScorer(
        judge, claims="sentences", verdicts="likelihood", coverage="key_sentences", key_sentences=1
    )
    results = scorer.score_many(items, on_error="return", progress=True)
    rows = [
        {
            "part": item["dataset_part"],
            "doc": item["doc_id"],
            "consistent": item["human"]["summary_has_error"] == 0,
            "value": min(c["pmi"] for c in r.claims),
        }
        for item, r in zip(items, results)
        if getattr(r, "claims", None)
    ]
    report = {"judge": judge.name, "rows": len(rows), "failed": len(items) - len(rows), "parts": {}}
    for part in PARTS:
        mine = [r for r in rows if r["part"] == part]
        c = calibrate([r["value"] for r in mine], [r["consistent"] for r in mine], resamples=args.resamples)
        report["parts"][part] = {"calibration": c.to_dict(), "applied": {}}
    for part in PARTS:
        mine = [r for r in rows if r["part"] == part]
        truth, docs = [r["consistent"] for r in mine], [r["doc"] for r in mine]
        thresholds = {f"{PARTS[p]}'s": report["parts"][p]["calibration"]["threshold"] for p in PARTS}
        thresholds["the default"] = LIKELIHOOD_THRESHOLD
        for name, t in thresholds.items():
            predicted = [r["value"] >= t for r in mine]
            report["parts"][part]["applied"][name] = {
                "threshold": t,
                **with_interval(balanced_accuracy, truth, predicted, docs, resamples=args.resamples),
            }
    lines = [
        "# Calibration across FRANK's collections (embedded judge, likelihood verdicts)",
        "",
        f"{len(rows)} summaries ({report['failed']} failed); a summary is consistent when its annotators found no "
        "error; its value is its lowest claim PMI (nats per token). `python -m benchmarks.calibration`",
        "",
        "| collection | rows (consistent) | threshold chosen there [95% CI] | its balanced accuracy [95% CI] |",
        "|---|---|---|---|",
    ]
    for part, name in PARTS.items():
        c = report["parts"][part]["calibration"]
        t_ci, ba_ci = c["threshold_interval"] or [None, None], c["balanced_accuracy_interval"] or [None, None]
        lines.append(
            f"| {name} | {c['rows']} ({c['consistent']}) | {c['threshold']:.2f} [{t_ci[0]}, {t_ci[1]}] | "
            f"{c['balanced_accuracy']:.3f} [{ba_ci[0]:.3f}, {ba_ci[1]:.3f}] |"
        )
    lines += ["", "| scored collection | threshold | value | balanced accuracy [95% CI] |", "|---|---|---|---|"]
    for part, name in PARTS.items():
        for which, a in report["parts"][part]["applied"].items():
            ci = a["ci"] or [float("nan")] * 2
            lines.append(f"| {name} | {which} | {a['threshold']:.2f} | {a['value']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] |")
    out = HERE / "results" / "calibration_frank"
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
