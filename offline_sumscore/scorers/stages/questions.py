"""The questions stage: the source (or a piece of it) -> closed questions (core/schemas.CLOSED_QUESTION)."""

from __future__ import annotations

from offline_sumscore.core import prompts, schemas
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require


def questions_request(
    sample_id: str, text: str, n: int, *, style: str, max_text_chars: int, exact: bool = False
) -> StageRequest:
    """n closed questions drawn from text; exact (DeepEval): exactly n, else up to n."""
    return StageRequest(
        sample_id,
        "questions",
        tuple(prompts.questions_prompt(text, n=n, exact=exact, style=style)),
        schemas.questions_list(n, max_text_chars, n if exact else 1),
    )


def questions_read(result: StageResult, stages: dict, key: str) -> list[str]:
    return list(require(result, stages, key).questions)
