"""The claims stage: the summary (or a part of it) -> atomic claims, each a full sentence that stands alone."""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel

from offline_sumscore.core.prompts import fence, two_axis
from offline_sumscore.core.schemas import text_list
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require


def claims_prompt(summary: str, *, style: str = "full") -> list[dict]:
    """Stage "claims" (atomic claims): the judge sees the summary only, so it cannot pick claims by the source."""
    return two_axis(
        f"{fence('summary', summary)}\n\n"
        "Task: list the factual claims this summary makes, in order. Each claim states one fact as a full sentence "
        "that stands on its own: names instead of pronouns, and the subject repeated. Split a sentence that states "
        "several facts. Keep numbers, dates, names and terms exactly as written. Leave out questions, commands, "
        "opinions and remarks about style. If the summary states no fact, give an empty list.",
        style,
    )


@cache
def claims_list(max_claims: int, text_chars: int) -> type[BaseModel]:
    """Stage "claims" (atomic): the summary's claims, drawn from the summary alone. Zero claims is allowed (a summary
    that states nothing checkable scores 0). max_claims is a safety bound, not a cap: a list that reaches it is
    drawn again from smaller parts of the summary, never cut."""
    return text_list("ClaimList", "claims", text_chars, 0, max_claims)


def claims_request(sample_id: str, part: str, *, style: str, max_claims: int, max_text_chars: int) -> StageRequest:
    return StageRequest(
        sample_id, "claims", tuple(claims_prompt(part, style=style)), claims_list(max_claims, max_text_chars)
    )


def claims_read(result: StageResult, stages: dict, key: str) -> list[str]:
    """The list's distinct claims, in order. A claim listed twice would count twice in alignment, and a judge caught
    in a loop writes its few claims over and over until the safety bound (Qwen2.5-Coder-1.5B on a court ruling: 3
    claims, repeated to 64): read as the claims it states, the repeats counted in the stage's audit
    (repeats_dropped) beside its raw output."""
    listed = list(require(result, stages, key).claims)
    distinct = list(dict.fromkeys(listed))
    if len(distinct) < len(listed):
        stages[key]["repeats_dropped"] = len(listed) - len(distinct)
    return distinct
