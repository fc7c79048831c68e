"""The embedded judge's coverage rule for short summaries: how many of a run's scores are 0 by construction, under the
rule before and the candidates, on development data and on ordinary 1-3 sentence summaries.

    python -m research.coverage_rule --data DATA/summeval_dev.jsonl --docs 10

The embedded design checks the source's first key sentences (5) against the summary, each a likelihood verdict at
the alignment threshold (2.0 nats per token: how much the summary makes the judge expect the sentence), and scores
min(alignment, coverage). A summary of one to three sentences cannot make the judge expect five sentences of the
source, so its coverage is 0 and so is its score. One scoring pass records every key sentence's verdict score; each
candidate rule is arithmetic over those (no second pass): fewer key sentences for a shorter summary (as many as it
has sentences, plus one, at most 5), the coverage verdicts read softly (mean P(covered) = mean sigmoid(score -
threshold)), and both. Reported per data set: the share of scores that are 0, the mean score, and on SummEval the
Spearman correlation of each rule's score with the experts' relevance and with the mean of their four ratings (read,
not tuned for). Writes results/coverage_rule.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from offline_sumscore import SummarizationScorer
from offline_sumscore.core.coverage_items import summary_sentences
from offline_sumscore.engine.judge import load_judge
from research.tables import publish

HERE = Path(__file__).resolve().parent

TESTS = HERE.parent / "tests" / "data" / "ordinary_summaries.jsonl"
THRESHOLD = 2.0


def spearman(x: list[float], y: list[float]) -> float:
    from benchmarks.lib.agreement_stats import spearman as rho

    found = rho(x, y)
    return float("nan") if found is None else float(found)


def rules() -> dict:
    """name -> (how many key sentences for a summary of n sentences, coverage soft or not, alignment soft or not)."""
    return {
        "before: 5 key sentences, verdicts": (lambda n: 5, False, False),
        "n + 1 key sentences (at most 5), verdicts": (lambda n: min(5, n + 1), False, False),
        "5 key sentences, soft coverage (mean P)": (lambda n: 5, True, False),
        "n + 1 key sentences (at most 5), soft coverage": (lambda n: min(5, n + 1), True, False),
        "5 key sentences, both axes soft": (lambda n: 5, True, True),
    }


def coverage_under(row: dict, k_of, soft: bool) -> float:
    n = len(summary_sentences(row["summary_text"]))
    verdicts = row["coverage_verdicts"][: k_of(n)]
    if not verdicts:
        return 0.0
    if soft:
        return sum(v["p_answered"] for v in verdicts) / len(verdicts)
    return sum(v["answered"] for v in verdicts) / len(verdicts)


def score_under(row: dict, k_of, soft: bool, soft_alignment: bool = False) -> float:
    claims = row["claims"]
    votes = [c["p_supported"] if soft_alignment else c["supported"] for c in claims]
    alignment = sum(votes) / len(votes) if votes else 0.0
    return min(alignment, coverage_under(row, k_of, soft))


def scored_rows(judge, items: list[dict]) -> list[dict]:
    scorer = SummarizationScorer(judge, include_reason=False)
    rows = []
    for item, result in zip(items, scorer.score_many([(i["source"], i["summary"]) for i in items])):
        row = result.to_dict()
        row.update(summary_text=item["summary"], human=item.get("human"))
        rows.append(row)
    return rows


def table(name: str, rows: list[dict]) -> list[str]:
    lines = [
        f"### {name} ({len(rows)} summaries)",
        "",
        "| rule | scores of 0 | mean score |"
        + (" Spearman: relevance | Spearman: mean of four |" if rows[0].get("human") else ""),
        "|---|---|---|" + ("---|---|" if rows[0].get("human") else ""),
    ]
    for rule, (k_of, soft, soft_alignment) in rules().items():
        scores = [score_under(r, k_of, soft, soft_alignment) for r in rows]
        zeros = sum(s == 0 for s in scores) / len(scores)
        line = f"| {rule} | {zeros:.0%} | {sum(scores) / len(scores):.3f} |"
        if rows[0].get("human"):
            relevance = [r["human"]["relevance"] for r in rows]
            mean4 = [sum(r["human"][k] for k in ("coherence", "consistency", "fluency", "relevance")) / 4 for r in rows]
            line += f" {spearman(scores, relevance):+.3f} | {spearman(scores, mean4):+.3f} |"
        lines.append(line)
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="summeval_dev.jsonl (development data)")
    ap.add_argument("--docs", type=int, default=10, help="SummEval documents (12 summaries each)")
    ap.add_argument("--name", default="coverage_rule")
    args = ap.parse_args()
    judge = load_judge("smollm2-135m")
    items = [json.loads(line) for line in args.data.read_text().splitlines()]
    docs: list[str] = []
    for item in items:
        doc = item["id"].split(":")[1]
        if doc not in docs:
            docs.append(doc)
    summeval = [i for i in items if i["id"].split(":")[1] in set(docs[: args.docs])]
    ordinary = [json.loads(line) for line in TESTS.read_text().splitlines()]
    out = ["# The embedded judge's coverage rule for short summaries", "", f"`{' '.join(sys.argv)}`", ""]
    out += [__doc__.split("\n\n", 2)[2].strip(), ""]
    for name, data in (("ordinary 1-3 sentence summaries (tests/data)", ordinary), ("SummEval dev", summeval)):
        out += table(name, scored_rows(judge, data))
    sentences = [len(summary_sentences(i["summary"])) for i in summeval]
    out.append(
        f"SummEval's summaries here have {min(sentences)} to {max(sentences)} sentences "
        f"(mean {sum(sentences) / len(sentences):.1f}); sigmoid(x) = 1 / (1 + e^-x) at {THRESHOLD} nats."
    )
    publish(args.name, out)


if __name__ == "__main__":
    main()
