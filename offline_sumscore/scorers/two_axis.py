"""SummarizationScorer: the two-axis summarization score (alignment x coverage), as popularised by Mastra's
summarization scorer and DeepEval's SummarizationMetric.

Waves per sample:
  1. "claims"    (source + summary): the summary's atomic claims, each with `supported`.
     "questions" (source only): at most max_questions closed questions the source answers yes, most important
                 first. The judge never sees the summary here, so questions are chosen without regard to it.
                 Skipped when the user supplies questions.
  2. "coverage"  (summary + one question, never the source): one request, one `answered` verdict, per question
                 asked; the engine computes the shared summary prefix once.
Then pure arithmetic: alignment = supported/claims, coverage = answered/min(len(questions), max_questions),
score = round_half_up(min(alignment, coverage) x scale).

The reason is composed from the verdicts, not generated: it costs no tokens and cannot contradict them.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import prompts, schemas
from ..arithmetic import two_axis_score
from ..chunking import allot
from ..errors import UsageError
from ..results import SummarizationResult
from ..samples import Sample, check_text
from ..stages import StageRequest
from .base import Plan, ScorerBase, first_prob, require, soft_score

BOOLEAN = ("t", "f")  # a JSON boolean's yes and no tokens start with these


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _listed(items: Sequence[str], limit: int = 3) -> str:
    shown = "; ".join(f'"{s}"' for s in items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def compose_reason(score: float, alignment: float, coverage: float, axis: str, claims: list[dict],
                   questions: list[str], verdicts: list[dict], strict_mode: bool) -> str:
    """"The score is S because ..." naming the axis that set the score and the claims or questions behind it."""
    head = f"The score is {_fmt(score)} because"
    if not claims:
        return f"{head} the judge found no claims in the summary, so alignment is 0."
    if not questions:
        return f"{head} no questions were drawn from the source, so coverage is 0."
    unsupported = [c["claim"] for c in claims if not c["supported"]]
    missed = [q for q, v in zip(questions, verdicts) if not v["answered"]] + questions[len(verdicts):]
    strict = " (strict mode: an axis below 1 counts as 0)" if strict_mode else ""
    why_a = (f"{len(unsupported)} of {len(claims)} claims are not supported by the source: {_listed(unsupported)}"
             if unsupported else "every claim is supported by the source")
    why_c = (f"the summary does not answer {len(missed)} of {len(questions)} questions: {_listed(missed)}"
             if missed else "the summary answers every question")
    if axis == "both":
        if alignment == 1:
            return f"{head} both alignment and coverage are 1: {why_a}, and {why_c}."
        return (f"{head} alignment and coverage are both {_fmt(round(alignment, 2))}{strict}: {why_a}; and {why_c}.")
    if axis == "alignment":
        return f"{head} alignment ({_fmt(round(alignment, 2))}) set it{strict}: {why_a}."
    return f"{head} coverage ({_fmt(round(coverage, 2))}) set it{strict}: {why_c}."


class SummarizationScorer(ScorerBase):
    """Two-axis summarization score on a local judge.

    Parameters
    ----------
    model : path to a model directory or .gguf file, a loaded Judge, or None for the embedded default.
    max_questions : at most this many questions are drawn (and counted) for coverage.
    scale : the score is min(alignment, coverage) x scale, rounded half up to 2 decimals.
    threshold, strict_mode : pass/fail as in DeepEval; strict makes each axis 0 unless it is 1.
    include_reason : compose the reason and ask the judge for a reason per verdict; off saves decoding.
    questions : user-supplied questions for every sample (DeepEval's assessment_questions); skips generation.
    max_claims, max_text_chars, max_reason_chars : caps that bound each stage's output.
    """
    metric = "two-axis"

    def __init__(self, model: Any = None, *, max_questions: int = 10, scale: float = 1.0, threshold: float = 0.5,
                 strict_mode: bool = False, include_reason: bool = True, questions: Sequence[str] | None = None,
                 max_claims: int = 16, max_text_chars: int = 200, max_reason_chars: int = 200, **engine_options):
        super().__init__(model, **engine_options)
        if not isinstance(max_questions, int) or max_questions < 1:
            raise UsageError(f"max_questions must be an integer >= 1. Given: {max_questions}")
        if not scale > 0:
            raise UsageError(f"scale must be > 0. Given: {scale}")
        if not 0 <= threshold <= 1:
            raise UsageError(f"threshold must be between 0 and 1. Given: {threshold}")
        for name, value in (("max_claims", max_claims), ("max_text_chars", max_text_chars),
                            ("max_reason_chars", max_reason_chars)):
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be an integer >= 1. Given: {value}")
        self.max_questions, self.scale, self.threshold = max_questions, scale, threshold
        self.strict_mode, self.include_reason = strict_mode, include_reason
        self.questions = list(questions) if questions is not None else None
        self.max_claims, self.max_text_chars, self.max_reason_chars = max_claims, max_text_chars, max_reason_chars

    @property
    def settings(self) -> dict[str, Any]:
        return {"max_questions": self.max_questions, "scale": self.scale, "threshold": self.threshold,
                "strict_mode": self.strict_mode, "include_reason": self.include_reason,
                "max_claims": self.max_claims, "max_text_chars": self.max_text_chars,
                "max_reason_chars": self.max_reason_chars, "prompt_version": prompts.PROMPT_VERSION}

    def score(self, source: str, summary: str, *, questions: Sequence[str] | None = None,
              id: str = "0") -> SummarizationResult:
        return self._score_one(self._sample(source, summary, questions, id))

    async def ascore(self, source: str, summary: str, *, questions: Sequence[str] | None = None,
                     id: str = "0") -> SummarizationResult:
        return await self._ascore_one(self._sample(source, summary, questions, id))

    def _sample(self, source, summary, questions, id) -> Sample:
        return Sample(id=id, source=check_text(source, "source", row_id=id),
                      summary=check_text(summary, "summary", row_id=id),
                      questions=tuple(questions) if questions is not None else None)

    def plan(self, sample: Sample) -> Plan:
        reason_chars = self.max_reason_chars if self.include_reason else None
        given = sample.questions if sample.questions is not None else self.questions
        stages: dict[str, dict] = {}

        def claims_request(source: str) -> StageRequest:
            return StageRequest(sample.id, "claims",
                                tuple(prompts.claims_prompt(source, sample.summary, max_claims=self.max_claims,
                                                            with_reason=self.include_reason)),
                                schemas.claims_list(self.max_claims, self.max_text_chars, reason_chars),
                                verdict_choice=BOOLEAN)

        # A source too long for the judge's context is split on sentence boundaries (sized on the claims prompt,
        # the longest). Claims are drawn and judged on the first piece, then each claim not yet supported is
        # checked against every further piece; questions are drawn from every piece in proportion to its length.
        pieces = self.source_pieces(sample.source, claims_request)
        shares = allot(self.max_questions, [len(p) for p in pieces])
        asking = [(k, n) for k, n in enumerate(shares) if n > 0] if given is None else []
        wave1 = [claims_request(pieces[0])]
        wave1 += [StageRequest(sample.id, "questions", tuple(prompts.questions_prompt(pieces[k], max_questions=n)),
                               schemas.questions_list(n, self.max_text_chars)) for k, n in asking]
        results = yield wave1
        claims = [c.model_dump() for c in require(results[0], stages).claims]
        if len(results[0].choice_probs) == len(claims):
            for claim, p in zip(claims, results[0].choice_probs):
                claim["p_supported"] = p
        questions = list(given) if given is not None else [
            q for (k, _), r in zip(asking, results[1:])
            for q in require(r, stages, "questions" if len(pieces) == 1 else f"questions.{k}").questions]
        asked = questions[:self.max_questions]
        checks = [(i, k) for i, c in enumerate(claims) if not c["supported"] for k in range(1, len(pieces))]
        # Checks first, then one request per question (the summary is their shared prefix, computed once).
        wave2 = [StageRequest(sample.id, "support",
                              tuple(prompts.support_prompt(pieces[k], claims[i]["claim"],
                                                           with_reason=self.include_reason)),
                              schemas.support_verdict(reason_chars), verdict_choice=BOOLEAN) for i, k in checks]
        wave2 += [StageRequest(sample.id, "coverage",
                               tuple(prompts.coverage_prompt(sample.summary, q, with_reason=self.include_reason)),
                               schemas.coverage_verdict(reason_chars), verdict_choice=BOOLEAN) for q in asked]
        replies = (yield wave2) if wave2 else []
        if len(pieces) > 1:
            for claim in claims:
                claim["piece"] = 0 if claim["supported"] else None
        for (i, k), reply in zip(checks, replies):
            found = require(reply, stages, f"support.{i}.{k}")
            claim = claims[i]
            if claim.get("p_supported") is not None and first_prob(reply) is not None:
                claim["p_supported"] = max(claim["p_supported"], first_prob(reply))  # supported by some piece
            if found.supported and not claim["supported"]:
                claim.update(supported=True, piece=k, **({"reason": found.reason} if reason_chars else {}))
        answers = replies[len(checks):]
        verdicts: list[dict] = []
        for i, answer in enumerate(answers):
            verdict = require(answer, stages, f"coverage.{i}").model_dump()
            verdict["p_answered"] = first_prob(answer)
            verdicts.append(verdict)
        value = two_axis_score(claims, questions, verdicts, max_questions=self.max_questions, scale=self.scale,
                               strict_mode=self.strict_mode, threshold=self.threshold)
        reason = (compose_reason(value.score, value.alignment, value.coverage, value.limiting_axis, claims, asked,
                                 verdicts, self.strict_mode) if self.include_reason else None)
        return SummarizationResult(
            id=sample.id, score=value.score, reason=reason, alignment=value.alignment, coverage=value.coverage,
            limiting_axis=value.limiting_axis, passed=value.passed, claims=claims, questions=questions,
            questions_from="user" if given is not None else "judge", coverage_verdicts=verdicts,
            soft_alignment=soft_score([c.get("p_supported") for c in claims]),
            soft_coverage=soft_score([v["p_answered"] for v in verdicts]),
            source_pieces=len(pieces), settings=self.settings, stages=stages)
