"""The two-axis metric's stages, each with its prompt (core/prompts.py holds the wording and PROMPT_VERSION), its
schema and its reading side by side: what a request asks, and what its reply means.

- claims     the summary (or a part of it) -> atomic claims
- questions  the source (or a piece of it) -> closed questions
- verdict    one statement (or question) against one text -> a verdict and its P(yes): a yes-no request, or a
             likelihood request with its baseline (PMI per token against likelihood_threshold)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from offline_sumscore.core import prompts, schemas
from offline_sumscore.core.errors import UsageError
from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import first_prob, require

YES_NO = ("Y", "N")  # a YesNoVerdict's yes and no tokens start with these


def claims_request(sample_id: str, part: str, *, style: str, max_claims: int, max_text_chars: int) -> StageRequest:
    return StageRequest(
        sample_id,
        "claims",
        tuple(prompts.claims_prompt(part, style=style)),
        schemas.claims_list(max_claims, max_text_chars),
    )


def claims_read(result: StageResult, stages: dict, key: str) -> list[str]:
    return list(require(result, stages, key).claims)


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


@dataclass(frozen=True)
class VerdictStage:
    """One verdict's requests and their reading, in the design the scorer resolved."""

    verdicts: str  # "yes-no" or "likelihood"
    style: str  # prompts.STYLES
    reasons: bool  # a yes-no verdict asks for a reason after it
    max_reason_chars: int
    likelihood_threshold: float

    @property
    def width(self) -> int:
        """Requests per verdict: a likelihood verdict needs its baseline too."""
        return 2 if self.verdicts == "likelihood" else 1

    def requests(
        self, sample_id: str, stage: str, text: str, statement: str, ask: str = "statement"
    ) -> list[StageRequest]:
        """The requests that give one verdict on statement against text. ask: "statement" (is it supported?),
        "question" (does text answer it yes?) or "answerable" (can text answer it?)."""
        if self.verdicts == "likelihood":
            if ask != "statement":
                raise UsageError(
                    "likelihood verdicts check statements, not questions: pass key_facts or use "
                    'coverage="key_sentences", or verdicts="yes-no" to ask questions'
                )
            return [
                StageRequest(
                    sample_id,
                    name,
                    tuple(prompts.likelihood_prompt(context, style=self.style)),
                    schemas.Likelihood,
                    continuation=statement,
                )
                for name, context in ((stage, text), ("baseline", ""))
            ]
        render = {
            "statement": prompts.statement_prompt,
            "question": prompts.question_prompt,
            "answerable": prompts.answerable_prompt,
        }[ask]
        return [
            StageRequest(
                sample_id,
                stage,
                tuple(render(text, statement, with_reason=self.reasons, style=self.style)),
                schemas.yes_no_verdict(self.max_reason_chars if self.reasons else None),
                verdict_choice=YES_NO,
            )
        ]

    def read(self, replies: list[StageResult], stages: dict, key: str) -> dict:
        """One verdict from its replies: {"verdict", "p", "reason"?, "pmi"?}. Raises JudgeOutputError loudly."""
        if self.verdicts == "likelihood":
            text = require(replies[0], stages, key)
            base = require(replies[1], stages, f"{key}.baseline")
            pmi = text.mean_logprob - base.mean_logprob
            margin = pmi - self.likelihood_threshold
            out = {"verdict": margin >= 0, "p": 1 / (1 + math.exp(-margin)), "pmi": round(pmi, 6)}
            evidence = weakest_token(text, base)
            if evidence is not None:
                out["evidence"] = evidence
            return out
        value = require(replies[0], stages, key)
        out = {"verdict": value.verdict, "p": first_prob(replies[0])}
        if value.reason is not None:
            out["reason"] = value.reason
        return out


def weakest_token(text: Likelihood, base: Likelihood) -> dict | None:
    """The statement's token that the text made least likely against the judge's expectation without it (the
    lowest pointwise mutual information), with the token the judge expected most there given the text: the words
    behind a likelihood verdict. None where the engine read no tokens (a scripted judge)."""
    if not text.token_logprobs or len(text.token_logprobs) != len(base.token_logprobs):
        return None
    pmis = [a - b for a, b in zip(text.token_logprobs, base.token_logprobs)]
    at = min(range(len(pmis)), key=pmis.__getitem__)
    return {
        "token": text.token_texts[at],
        "at": at,
        "pmi": round(pmis[at], 3),
        "p": round(math.exp(text.token_logprobs[at]), 4),
        "expected": text.expected_texts[at],
        "p_expected": round(math.exp(text.expected_logprobs[at]), 4),
    }


class Replies:
    """A wave's replies, handed to each stage in the order its requests went into the wave."""

    def __init__(self, results: list[StageResult]):
        self.results, self.at = results, 0

    def take(self, n: int) -> list[StageResult]:
        part = self.results[self.at : self.at + n]
        self.at += n
        return part
