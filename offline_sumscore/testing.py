"""Tools for users' own tests (docs/testing.md): assert_summary holds a summary to a score and fails with the reason
and the verdicts behind it; ScriptedEngine is a judge that answers each stage with queued replies, for testing a
pipeline around the scorers without a model.

from offline_sumscore.testing import assert_summary

def test_my_summarizer():
    assert_summary(document, my_summarizer(document), min_score=0.7)
"""

from __future__ import annotations

from typing import Any

from offline_sumscore.engine.scripted import Raises, ScriptedEngine, ScriptExhausted, Truncated
from offline_sumscore.scorers import SummarizationScorer

__all__ = ["assert_summary", "ScriptedEngine", "Truncated", "Raises", "ScriptExhausted"]

_scorers: dict[Any, SummarizationScorer] = {}  # one loaded judge per model across a test session


def assert_summary(
    source: str,
    summary: str,
    *,
    min_score: float = 0.7,
    model: Any = None,
    scorer: SummarizationScorer | None = None,
    **options,
):
    """Score with the two-axis metric; raise AssertionError naming the score, the reason, the unsupported claims and
    the unanswered questions when the score (on 0..1) is below min_score. Returns the result otherwise."""
    if scorer is None:
        key = (model if isinstance(model, (str, type(None))) else id(model), tuple(sorted(options.items())))
        scorer = _scorers.get(key) or _scorers.setdefault(key, SummarizationScorer(model, **options))
    result = scorer.score(source, summary)
    value = result.score / scorer.scale
    if value < min_score:
        lines = [f"summary scored {value:.2f} < {min_score:.2f}: {result.reason or ''}"]
        lines += [
            f"  unsupported claim: {c['claim']}" + (f" ({c['reason']})" if c.get("reason") else "")
            for c in result.claims
            if not c["supported"]
        ]
        lines += [
            f"  unanswered question: {q}"
            for q, v in zip(result.questions, result.coverage_verdicts)
            if not v["answered"]
        ]
        raise AssertionError("\n".join(lines))
    return result
