"""Planted errors a reader catches, per kind: does the judge catch them, and does it leave faithful text alone?

    python -m benchmarks.perturbations                         # the default judge (the 1.5B), every pair (~20 min)
    python -m benchmarks.perturbations --model smollm2-135m    # the embedded judge
    python -m benchmarks.perturbations --kinds date,role --documents 4  # a cut, for a quick look

benchmarks/data/perturbations.jsonl: 12 short documents in 7 domains (civic, health, sports, business, legal, weather,
cooking), each with a faithful summary and one copy of it per planted error, one error each, of 10 kinds: a changed
number, date, or unit (million/billion, metres/feet, minutes/seconds); roles swapped (who did what to whom); an outcome
negated; a quantity word for a share ("every", "all", "most"); a wrong entity; a wrong cause; an added fact; a
proposal stated as done (modality). Written for this project; no summary was tuned against a judge.

Each faithful summary is scored once and each planted copy once, by the two-axis metric at the judge's own design;
coverage is held to one fixed key fact (the source's first sentence), because the errors are claims' errors and the
run's time goes to alignment. Reported per kind: recall (the planted copy's alignment below 1: a claim not
supported), the share where the planted copy scores below its faithful twin, and over the documents the share of
faithful summaries left at alignment 1. Writes benchmarks/results/perturbations_<judge>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from offline_sumscore import SummarizationScorer, load_judge

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "perturbations.jsonl"
RESULTS = HERE / "results"


def pairs(path: Path, kinds: set[str] | None, documents: int | None) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = [r for r in rows if kinds is None or r["kind"] in kinds]
    if documents is not None:
        allowed = list(dict.fromkeys(r["document"] for r in kept))[:documents]
        kept = [r for r in kept if r["document"] in allowed]
    return kept


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]


def tally(items: list[dict], faithful: dict[str, dict], planted: dict[str, dict]) -> dict:
    """Per kind: recall (alignment below 1) and the share scored below the faithful twin; failed rows apart."""
    kinds: dict[str, dict] = defaultdict(lambda: {"pairs": 0, "caught": 0, "below_twin": 0, "failed": 0})
    for item in items:
        k, twin, copy = kinds[item["kind"]], faithful[item["document"]], planted[item["id"]]
        k["pairs"] += 1
        if "error" in copy or "error" in twin:
            k["failed"] += 1
            continue
        k["caught"] += copy["alignment"] < 1.0
        k["below_twin"] += copy["score"] < twin["score"]
    for k in kinds.values():
        judged = k["pairs"] - k["failed"]
        k["recall"] = k["caught"] / judged if judged else None
        k["below_twin_share"] = k["below_twin"] / judged if judged else None
    return dict(sorted(kinds.items()))


def as_row(result) -> dict:
    if hasattr(result, "error"):
        return {"error": str(result.error)}
    return {
        "alignment": result.alignment,
        "coverage": result.coverage,
        "score": result.score,
        "reason": result.reason,
        "claims": [{k: c.get(k) for k in ("claim", "supported", "p_supported", "reason")} for c in result.claims],
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Planted errors, judge {report['judge']['name']}",
        "",
        f"{report['pairs']} pairs on {report['documents']} documents, two-axis metric at the judge's design, coverage "
        f"held to one key fact; {report['seconds']} s ({report['seconds_per_row']} s a row). Faithful summaries left "
        f"at alignment 1: {report['faithful_untouched']}/{report['faithful_judged']} "
        f"({100 * report['faithful_untouched_share']:.0f}%).",
        "",
        "| kind | pairs | caught (alignment < 1) | recall | scored below the faithful twin | failed rows |",
        "|---|---|---|---|---|---|",
    ]
    for kind, k in report["kinds"].items():
        recall = "n/a" if k["recall"] is None else f"{100 * k['recall']:.0f}%"
        below = "n/a" if k["below_twin_share"] is None else f"{100 * k['below_twin_share']:.0f}%"
        lines.append(f"| {kind} | {k['pairs']} | {k['caught']} | {recall} | {below} | {k['failed']} |")
    lines += ["", f"Kinds at 70% recall or more: {report['kinds_at_70']} of {len(report['kinds'])}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a judge (default: the default judge, as `sumscore score` picks)")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--kinds", default=None, help="comma-separated kinds (default: all)")
    ap.add_argument("--documents", type=int, default=None, help="the first N documents only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    items = pairs(args.data, set(args.kinds.split(",")) if args.kinds else None, args.documents)
    if not items:
        raise SystemExit(f"no pairs in {args.data} for --kinds {args.kinds} --documents {args.documents}")
    judge = load_judge(args.model)
    scorer = SummarizationScorer(judge, max_reason_chars=60)
    documents = {r["document"]: r for r in items}
    started = time.perf_counter()

    def sample(row_id: str, source: str, summary: str) -> dict:
        return {"id": row_id, "source": source, "summary": summary, "key_facts": [first_sentence(source)]}

    samples = [sample(d, r["source"], r["faithful"]) for d, r in documents.items()]
    samples += [sample(r["id"], r["source"], r["perturbed"]) for r in items]
    results = scorer.score_many(samples, on_error="return", progress=True)
    seconds = time.perf_counter() - started
    rows = {s["id"]: as_row(r) for s, r in zip(samples, results)}
    faithful = {d: rows[d] for d in documents}
    planted = {r["id"]: rows[r["id"]] for r in items}
    judged = [f for f in faithful.values() if "error" not in f]
    kinds = tally(items, faithful, planted)
    report = {
        "judge": judge.describe(),
        "data": str(args.data),
        "pairs": len(items),
        "documents": len(documents),
        "seconds": round(seconds, 1),
        "seconds_per_row": round(seconds / len(samples), 1),
        "faithful_judged": len(judged),
        "faithful_untouched": sum(f["alignment"] == 1.0 for f in judged),
        "faithful_untouched_share": sum(f["alignment"] == 1.0 for f in judged) / len(judged) if judged else 0.0,
        "kinds": kinds,
        "kinds_at_70": sum(1 for k in kinds.values() if (k["recall"] or 0) >= 0.7),
        "rows": rows,
    }
    text = markdown(report)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", judge.name.removesuffix(".gguf"))
    out = args.out or RESULTS / f"perturbations_{name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n")
    Path(f"{out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
