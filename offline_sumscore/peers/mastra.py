"""Mastra-shaped results: the fields of Mastra's summarization scorer run result, named as Mastra names them.

preprocessStepResult holds the claim verdicts ("alignment") and the questions drawn from the source;
analyzeStepResult holds one coverage verdict per question asked, with the question beside it.
"""

from __future__ import annotations

from typing import Any


def to_mastra(row: dict[str, Any]) -> dict[str, Any]:
    """One two-axis OUTPUT row (or SummarizationResult.to_dict()) in Mastra's shape; failed rows keep their error."""
    if row.get("metric") not in (None, "two-axis"):
        raise ValueError(f"the Mastra shape is the two-axis metric's; this row is {row.get('metric')!r}")
    if row.get("error"):
        return {"id": row.get("id"), "score": None, "reason": None, "error": row["error"]}
    questions = list(row.get("questions") or [])
    asked = questions[: len(row.get("coverage_verdicts") or [])]
    return {
        "id": row.get("id"),
        "score": row["score"],
        "reason": row.get("reason"),
        "preprocessStepResult": {
            "alignment": [
                {"claim": c["claim"], "supported": c["supported"], "reason": c.get("reason", "")}
                for c in row.get("claims") or []
            ],
            "questions": questions,
        },
        "analyzeStepResult": {
            "coverage": [
                {"question": q, "answered": v["answered"], "reason": v.get("reason", "")}
                for q, v in zip(asked, row.get("coverage_verdicts") or [])
            ]
        },
    }
