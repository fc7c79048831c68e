"""The keyphrases stage (Ragas-style SummaryScore): the source (or a piece of it) -> its people, organisations,
places, dates, amounts and percentages, as written."""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel

from offline_sumscore.core.prompts import fence, ragas
from offline_sumscore.core.schemas import text_list
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require


def keyphrases_prompt(text: str) -> list[dict]:
    """Stage "keyphrases" (Ragas-style SummaryScore). The number is the judge's to choose, as in Ragas (the schema's
    safety bound aside)."""
    return ragas(
        f"{fence('text', text)}\n\n"
        "Task: list the key phrases of these kinds found in the text: people, organisations, locations, dates and "
        "times, money amounts, percentages. Copy each as written in the text."
    )


@cache
def keyphrases_list(max_keyphrases: int, text_chars: int) -> type[BaseModel]:
    """Stage "keyphrases" (Ragas-style): named entities, dates, money, percentages of the text."""
    return text_list("KeyphraseList", "keyphrases", text_chars, 0, max_keyphrases)


def keyphrases_request(sample_id: str, text: str, n: int, *, max_text_chars: int) -> StageRequest:
    """Up to n keyphrases of text (the number is the judge's to choose, as in Ragas; n is a safety bound)."""
    return StageRequest(sample_id, "keyphrases", tuple(keyphrases_prompt(text)), keyphrases_list(n, max_text_chars))


def keyphrases_read(result: StageResult, stages: dict, key: str) -> list[str]:
    return list(require(result, stages, key).keyphrases)
