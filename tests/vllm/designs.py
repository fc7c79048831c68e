"""The designs the vLLM parity test scores on both engines: the embedded judge's own (likelihood verdicts), the brought
judge's with Yes/No verdicts and questions written as JSON, and the Ragas-style summary score ("1"/"0" answers)."""

import json
from pathlib import Path

from offline_sumscore import SummarizationScorer, SummaryScore
from tests.copied_keyphrases import CopiedKeyphrases

DEMO = Path(__file__).resolve().parents[2] / "offline_sumscore" / "examples" / "demo.jsonl"
DESIGNS = {
    "embedded": (SummarizationScorer, {}),
    "yes-no": (
        SummarizationScorer,
        dict(claims="sentences", coverage="questions", verdicts="yes-no", max_questions=3, max_reason_chars=60),
    ),
    # Its keyphrases copied from each text (CopiedKeyphrases): the 135M echoes the prompt's kinds, which fail the stage.
    "summary-score": (SummaryScore, dict(max_keyphrases=3, max_questions=3, answers="questions")),
    "summary-score-likelihood": (SummaryScore, dict(answers="likelihood")),
}


def demo_rows() -> list[dict]:
    return [json.loads(line) for line in DEMO.open()]


def score_all(engine, rows: list[dict]) -> dict[str, list[dict]]:
    """Each design's results as plain dicts (what an OUTPUT row holds)."""
    out = {}
    for name, (metric, options) in DESIGNS.items():
        asking = CopiedKeyphrases(engine) if name == "summary-score" else engine
        results = metric(engine=asking, **options).score_many(rows, on_error="return")
        out[name] = [r.to_dict() for r in results]
    return out
