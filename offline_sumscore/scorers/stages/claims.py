"""The claims stage: the summary (or a part of it) -> atomic claims, each a full sentence that stands alone."""

from __future__ import annotations

from offline_sumscore.core import prompts, schemas
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require


def claims_request(sample_id: str, part: str, *, style: str, max_claims: int, max_text_chars: int) -> StageRequest:
    return StageRequest(
        sample_id,
        "claims",
        tuple(prompts.claims_prompt(part, style=style)),
        schemas.claims_list(max_claims, max_text_chars),
    )


def claims_read(result: StageResult, stages: dict, key: str) -> list[str]:
    return list(require(result, stages, key).claims)
