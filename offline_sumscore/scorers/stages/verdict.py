"""The verdict stage both metrics ask for: one statement (or question) against one text -> a verdict and its
P(yes). A yes-no request (a YesNoVerdict, P(yes) read at its first token), or a likelihood request with its
baseline: the statement's PMI per token against the threshold, with the fact-conflict rules of likelihood.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from offline_sumscore.core import prompts, schemas
from offline_sumscore.core.errors import UsageError
from offline_sumscore.core.figures import aligned_sentence
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import first_prob, require
from offline_sumscore.scorers.stages.likelihood import CONFLICT_WEIGHT, typed_conflict, weakest_token

YES_NO = ("Y", "N")  # a YesNoVerdict's yes and no tokens start with these
LIKELIHOOD_THRESHOLD = 2.0  # nats per token; see SummarizationScorer's likelihood_threshold parameter


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
        self, sample_id: str, stage: str, text: str, statement: str, ask: str = "statement", whole_summary: bool = False
    ) -> list[StageRequest]:
        """The requests that give one verdict on statement against text. ask: "statement" (is it supported?),
        "question" (does text answer it yes?) or "answerable" (can text answer it?). whole_summary: the statement
        is a summary of one sentence, which a likelihood verdict asks as the judge's one-sentence summary."""
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
                    tuple(prompts.likelihood_prompt(context, style=self.style, whole_summary=whole_summary)),
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

    def read(self, replies: list[StageResult], stages: dict, key: str, context: str | None = None) -> dict:
        """One verdict from its replies: {"verdict", "p", "reason"?, "pmi"?}. context: the text the statement was
        checked against (it names the words the judge expects). Raises JudgeOutputError loudly."""
        if self.verdicts == "likelihood":
            text = require(replies[0], stages, key)
            base = require(replies[1], stages, f"{key}.baseline")
            pmi = text.mean_logprob - base.mean_logprob
            # Where the statement sits in the text: its evidence is read there (typed_conflict, weakest_token).
            aligned = aligned_sentence("".join(text.token_texts), context) if context else None
            conflict = typed_conflict(text, base, context=context, aligned=aligned)
            score = pmi + CONFLICT_WEIGHT * conflict["pmi"] if conflict else pmi
            margin = score - self.likelihood_threshold
            out = {"verdict": margin >= 0, "p": 1 / (1 + math.exp(-margin)), "pmi": round(pmi, 6)}
            evidence = weakest_token(text, base, context, aligned)
            if evidence is not None:
                out["evidence"] = evidence
            if conflict:
                out["conflict"], out["verdict_score"] = conflict, round(score, 6)
            return out
        value = require(replies[0], stages, key)
        out = {"verdict": value.verdict, "p": first_prob(replies[0])}
        if value.reason is not None:
            out["reason"] = value.reason
        return out
