"""The designs the vLLM parity test scores on both engines: the embedded judge's own (likelihood verdicts), the brought
judge's with Yes/No verdicts and questions written as JSON, and the Ragas-style summary score ("1"/"0" answers)."""

import json
from pathlib import Path

from offline_sumscore import SummarizationScorer, SummaryScore

DEMO = Path(__file__).resolve().parents[2] / "offline_sumscore" / "examples" / "demo.jsonl"
DESIGNS = {
    "embedded": (SummarizationScorer, {}),
    "yes-no": (
        SummarizationScorer,
        dict(claims="sentences", coverage="questions", verdicts="yes-no", max_questions=3, max_reason_chars=60),
    ),
    "summary-score": (SummaryScore, dict(max_keyphrases=3, max_questions=3, answers="questions")),
    "summary-score-likelihood": (SummaryScore, dict(answers="likelihood")),
}


def demo_rows() -> list[dict]:
    return [json.loads(line) for line in DEMO.open()]


def score_all(engine, rows: list[dict]) -> dict[str, list[dict]]:
    """Each design's results as plain dicts (what an OUTPUT row holds)."""
    out = {}
    for name, (metric, options) in DESIGNS.items():
        results = metric(engine=engine, **options).score_many(rows, on_error="return")
        out[name] = [r.to_dict() for r in results]
    return out
