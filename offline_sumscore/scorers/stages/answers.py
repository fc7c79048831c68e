"""The Ragas answers stage (Ragas-style SummaryScore): one closed question against the summary alone -> "1" (the
summary answers it) or "0", with P("1") read at that token."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, create_model

from offline_sumscore.core.prompts import fence, ragas
from offline_sumscore.core.schemas import STRICT
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require

ANSWER_CHOICE = ("1", "0")  # the answer's yes and no tokens: P(yes) is read at them


def ragas_answer_prompt(summary: str, question: str) -> list[dict]:
    """Stage "ragas_answers" (Ragas-style SummaryScore), one request per question: from the summary alone."""
    return ragas(
        f"{fence('summary', summary)}\n\n{fence('question', question)}\n\n"
        'Task: answer "1" if the summary alone gives enough information to answer the question, '
        'and "0" if it does not.'
    )


@cache
def ragas_answer() -> type[BaseModel]:
    """Stage "ragas_answers", one request per question: "1" or "0"."""
    return create_model("RagasAnswer", __config__=STRICT, answer=(Literal["1", "0"], ...))


def answer_request(sample_id: str, summary: str, question: str) -> StageRequest:
    return StageRequest(
        sample_id,
        "ragas_answers",
        tuple(ragas_answer_prompt(summary, question)),
        ragas_answer(),
        verdict_choice=ANSWER_CHOICE,
    )


def answer_read(result: StageResult, stages: dict, key: str) -> str:
    return require(result, stages, key).answer
