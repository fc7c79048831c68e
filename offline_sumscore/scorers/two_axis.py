"""SummarizationScorer: the two-axis summarization score (alignment x coverage), as popularised by Mastra's
summarization scorer and DeepEval's SummarizationMetric.

Every verdict is one claim or one coverage item, judged alone:
- claims    claims="atomic": stage "claims" sees the summary only and lists self-contained atomic claims (a long
            summary is asked in parts of CLAIM_PART_SENTENCES sentences; a part whose list reaches the schema's
            bound is asked again in halves, never cut). claims="sentences": the summary's sentences are the claims.
- coverage  coverage="questions": stage "questions" sees the source only and writes closed questions (duplicates
            and generic ones are dropped, with the reason kept; coverage_items). Questions or key facts given by
            the user replace them. coverage="key_sentences": the source's lead sentences, checked as statements.
- support   the source (or each piece of a long one) then one claim: supported when any piece supports it.
- coverage  the summary then one item: a question ("does the summary state yes?") or a statement ("is it
            supported by the summary?"). DeepEval's flavor also asks each question of the source.
A verdict is read from the judge's distribution in one forward pass, never from free text:
- verdicts="yes-no": "Yes"/"No" under a grammar; P(yes) = P(Yes)/(P(Yes)+P(No)) from that one distribution; a
  reason, when asked for, is decoded after the verdict.
- verdicts="likelihood": the judge's mean log-probability per token of the statement after the text, minus the
  same without the text (stage "baseline"): how much the text makes the judge expect the statement (PMI). The
  verdict is PMI >= likelihood_threshold nats per token and P(yes) = sigmoid(PMI - threshold).
The defaults follow the judge (judge.EMBEDDED_STAGES, BROUGHT_STAGES); each row's settings record the choice.

Then pure arithmetic (arithmetic.two_axis_score) in the chosen flavor. The reason is composed from the verdicts,
not generated: it costs no tokens and cannot contradict them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from offline_sumscore.core import prompts, schemas
from offline_sumscore.core.arithmetic import FLAVORS, two_axis_score
from offline_sumscore.core.coverage_items import distinct_questions, key_sentences, summary_sentences
from offline_sumscore.core.errors import Failure, JudgeOutputError, UsageError, check_count
from offline_sumscore.core.results import SummarizationResult
from offline_sumscore.core.samples import Sample, checked_sample
from offline_sumscore.core.source_pieces import allot
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import Plan, ScorerBase, first_prob, require, soft_score

YES_NO = ("Y", "N")  # a YesNoVerdict's yes and no tokens start with these
CLAIM_PART_SENTENCES = 8  # atomic claims are asked of at most this many summary sentences at a time
CLAIMS_BOUND = 64  # safety bound of one claims list; a list that reaches it is asked again in halves
LIKELIHOOD_THRESHOLD = 2.0  # nats per token; see the likelihood_threshold parameter
CLAIMS_MODES, COVERAGE_MODES, VERDICT_MODES = (
    ("atomic", "sentences"),
    ("questions", "key_sentences"),
    ("yes-no", "likelihood"),
)


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _listed(items: Sequence[str], limit: int = 3) -> str:
    shown = "; ".join(f'"{s}"' for s in items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def compose_reason(
    score: float,
    alignment: float,
    coverage: float,
    axis: str,
    claims: list[dict],
    questions: list[str],
    verdicts: list[dict],
    strict_mode: bool,
    items: str = "questions",
) -> str:
    """ "The score is S because ..." naming the axis that set the score and the claims or items behind it."""
    head = f"The score is {_fmt(score)} because"
    if not claims:
        return f"{head} the summary makes no claim that could be checked against the source, so alignment is 0."
    if not questions:
        return f"{head} there was nothing to check coverage against (no {items}), so coverage is 0."
    counted = [(q, v) for q, v in zip(questions, verdicts) if v.get("source_answered", True)]
    unsupported = [c["claim"] for c in claims if not c["supported"]]
    missed = [q for q, v in counted if not v["answered"]] + questions[len(verdicts) :]
    strict = " (strict mode: an axis below 1 counts as 0)" if strict_mode else ""
    why_a = (
        f"{len(unsupported)} of {len(claims)} claims are not supported by the source: {_listed(unsupported)}"
        if unsupported
        else "every claim is supported by the source"
    )
    why_c = (
        f"the summary does not cover {len(missed)} of {len(counted)} {items}: {_listed(missed)}"
        if missed
        else f"the summary covers every one of the {items}"
    )
    if axis == "both":
        if alignment == 1:
            return f"{head} both alignment and coverage are 1: {why_a}, and {why_c}."
        return f"{head} alignment and coverage are both {_fmt(round(alignment, 2))}{strict}: {why_a}; and {why_c}."
    if axis == "alignment":
        return f"{head} alignment ({_fmt(round(alignment, 2))}) set it{strict}: {why_a}."
    return f"{head} coverage ({_fmt(round(coverage, 2))}) set it{strict}: {why_c}."


def _choose(name: str, value: str, allowed: Sequence[str]) -> str:
    if value != "auto" and value not in allowed:
        raise UsageError(f"{name} must be auto or one of {', '.join(allowed)}. Given: {value}")
    return value


class SummarizationScorer(ScorerBase):
    """Two-axis summarization score on a local judge.

    Parameters
    ----------
    model : path to a model directory or .gguf file, a loaded Judge, or None for the embedded default.
    flavor : "mastra" (default): Mastra's scorer, score rounded as its roundToTwoDecimals; "deepeval": DeepEval's
        SummarizationMetric (exactly max_questions questions, each also asked of the source, only questions the
        source answers count, no rounding).
    claims, coverage, verdicts : how the stages ask (see the module docstring); "auto" follows the judge.
    prompt_style : "full" (system message with the principles) or "bare"; "auto" follows the judge.
    max_questions : questions drawn (at most; exactly, for deepeval) and counted. Default 10 (mastra), 5 (deepeval).
    key_sentences : how many lead sentences of the source coverage="key_sentences" checks.
    likelihood_threshold : nats per token by which the text must raise the statement's likelihood for a "yes".
        The 2.0 default was set on the embedded judge with FRANK's sentence labels (balanced accuracy 0.88 there;
        0.67 on REALSumm key facts, which did not choose it); another judge needs its own.
    scale : the score is min(alignment, coverage) x scale.
    threshold, strict_mode : pass/fail as in DeepEval; strict makes each axis 0 unless it is 1.
    include_reason : compose the reason, and with yes-no verdicts ask the judge for a reason per verdict.
    questions : questions for every sample (DeepEval's assessment_questions); key_facts : statements for every
        sample (FineSurE's key facts), checked against the summary. Either skips question generation.
    max_claims, max_text_chars, max_reason_chars : bounds on each stage's output.
    """

    metric = "two-axis"

    def __init__(
        self,
        model: Any = None,
        *,
        flavor: str = "mastra",
        claims: str = "auto",
        coverage: str = "auto",
        verdicts: str = "auto",
        prompt_style: str = "auto",
        max_questions: int | None = None,
        key_sentences: int = 5,
        likelihood_threshold: float = LIKELIHOOD_THRESHOLD,
        scale: float = 1.0,
        threshold: float = 0.5,
        strict_mode: bool = False,
        include_reason: bool = True,
        questions: Sequence[str] | None = None,
        key_facts: Sequence[str] | None = None,
        max_claims: int = CLAIMS_BOUND,
        max_text_chars: int = 200,
        max_reason_chars: int = 200,
        **engine_options,
    ):
        super().__init__(model, **engine_options)
        if flavor not in FLAVORS:
            raise UsageError(f"flavor must be one of {', '.join(FLAVORS)}. Given: {flavor}")
        self.flavor = flavor
        self.claims_mode = _choose("claims", claims, CLAIMS_MODES)
        self.coverage_mode = _choose("coverage", coverage, COVERAGE_MODES)
        self.verdicts = _choose("verdicts", verdicts, VERDICT_MODES)
        self.prompt_style = _choose("prompt_style", prompt_style, prompts.STYLES)
        if max_questions is None:
            max_questions = 10 if flavor == "mastra" else 5
        for name, value, most in (
            ("max_questions", max_questions, 200),
            ("key_sentences", key_sentences, 200),
            ("max_claims", max_claims, 1_000),
            ("max_text_chars", max_text_chars, 10_000),
            ("max_reason_chars", max_reason_chars, 10_000),
        ):
            check_count(name, value, most)
        if not scale > 0:
            raise UsageError(f"scale must be > 0. Given: {scale}")
        if not 0 <= threshold <= 1:
            raise UsageError(f"threshold must be between 0 and 1. Given: {threshold}")
        if questions is not None and key_facts is not None:
            raise UsageError("give questions or key_facts, not both")
        self.max_questions, self.key_sentences, self.likelihood_threshold = (
            max_questions,
            key_sentences,
            float(likelihood_threshold),
        )
        self.scale, self.threshold, self.strict_mode, self.include_reason = (
            scale,
            threshold,
            strict_mode,
            include_reason,
        )
        # DeepEval: an empty assessment_questions list means "generate them".
        self.questions = list(questions) if questions else None
        self.key_facts = list(key_facts) if key_facts is not None else None
        self.max_claims, self.max_text_chars, self.max_reason_chars = max_claims, max_text_chars, max_reason_chars
        self._design: dict[str, Any] | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """The options as given ("auto" included): what a resumed run must match. Rows hold the resolved design."""
        return {
            "flavor": self.flavor,
            "claims": self.claims_mode,
            "coverage": self.coverage_mode,
            "verdicts": self.verdicts,
            "prompt_style": self.prompt_style,
            "max_questions": self.max_questions,
            "key_sentences": self.key_sentences,
            "likelihood_threshold": self.likelihood_threshold,
            "scale": self.scale,
            "threshold": self.threshold,
            "strict_mode": self.strict_mode,
            "include_reason": self.include_reason,
            "max_claims": self.max_claims,
            "max_text_chars": self.max_text_chars,
            "max_reason_chars": self.max_reason_chars,
            "prompt_version": prompts.PROMPT_VERSION,
        }

    @property
    def design(self) -> dict[str, Any]:
        """The stage design in use: each "auto" resolved from the judge's stage defaults (this loads the judge)."""
        if self._design is None:
            defaults = self.stacked_engine.describe().get("judge", {}).get("stage_defaults") or {}
            from offline_sumscore.engine.judge import BROUGHT_STAGES

            def pick(given: str, key: str) -> str:
                return given if given != "auto" else defaults.get(key, BROUGHT_STAGES[key])

            design = {
                "claims": pick(self.claims_mode, "claims"),
                "coverage": pick(self.coverage_mode, "coverage"),
                "verdicts": pick(self.verdicts, "verdicts"),
                "prompt_style": pick(self.prompt_style, "prompt_style"),
            }
            design["verdict_reasons"] = self.include_reason and design["verdicts"] == "yes-no"
            if design["verdicts"] == "likelihood":
                design["likelihood_threshold"] = self.likelihood_threshold
            self._design = design
        return self._design

    def score(
        self,
        source: str,
        summary: str,
        *,
        questions: Sequence[str] | None = None,
        key_facts: Sequence[str] | None = None,
        id: str | None = None,
    ) -> SummarizationResult:
        return self._score_one(self._sample(source, summary, questions, key_facts, id))

    async def ascore(
        self,
        source: str,
        summary: str,
        *,
        questions: Sequence[str] | None = None,
        key_facts: Sequence[str] | None = None,
        id: str | None = None,
    ) -> SummarizationResult:
        return await self._ascore_one(self._sample(source, summary, questions, key_facts, id))

    def _sample(self, source, summary, questions, key_facts, id) -> Sample:
        if questions is not None and key_facts is not None:
            raise UsageError("give questions or key_facts, not both")
        # An error names the id only when the caller gave one; the result's id is then "0".
        return checked_sample(
            id if id is not None else "0",
            source,
            summary,
            questions=questions,
            key_facts=key_facts,
            error_id=id,
            python=True,
        )

    # -- the plan ---------------------------------------------------------------------------------------------
    def _verdict(self, sid: str, stage: str, text: str, statement: str, ask: str = "statement") -> list[StageRequest]:
        """The requests that give one verdict: one yes-no request, or a likelihood request and its baseline."""
        d = self.design
        style, why = d["prompt_style"], d["verdict_reasons"]
        if d["verdicts"] == "likelihood":
            if ask != "statement":
                raise UsageError(
                    "likelihood verdicts check statements, not questions: pass key_facts or use "
                    'coverage="key_sentences", or verdicts="yes-no" to ask questions'
                )
            return [
                StageRequest(
                    sid,
                    stage,
                    tuple(prompts.likelihood_prompt(text, style=style)),
                    schemas.Likelihood,
                    continuation=statement,
                ),
                StageRequest(
                    sid,
                    "baseline",
                    tuple(prompts.likelihood_prompt("", style=style)),
                    schemas.Likelihood,
                    continuation=statement,
                ),
            ]
        render = {
            "statement": prompts.statement_prompt,
            "question": prompts.question_prompt,
            "answerable": prompts.answerable_prompt,
        }[ask]
        return [
            StageRequest(
                sid,
                stage,
                tuple(render(text, statement, with_reason=why, style=style)),
                schemas.yes_no_verdict(self.max_reason_chars if why else None),
                verdict_choice=YES_NO,
            )
        ]

    def _read(self, replies: list[StageResult], stages: dict, key: str) -> dict:
        """One verdict from its replies: {"verdict", "p", "reason"?, "pmi"?}. Raises JudgeOutputError loudly."""
        if self.design["verdicts"] == "likelihood":
            text = require(replies[0], stages, key)
            base = require(replies[1], stages, f"{key}.baseline")
            pmi = text.mean_logprob - base.mean_logprob
            margin = pmi - self.likelihood_threshold
            return {"verdict": margin >= 0, "p": 1 / (1 + math.exp(-margin)), "pmi": round(pmi, 6)}
        value = require(replies[0], stages, key)
        out = {"verdict": value.verdict, "p": first_prob(replies[0])}
        if value.reason is not None:
            out["reason"] = value.reason
        return out

    def plan(self, sample: Sample) -> Plan:
        d, sid = self.design, sample.id
        stages: dict[str, dict] = {}
        width = 2 if d["verdicts"] == "likelihood" else 1  # requests per verdict

        # What to check. Claims and coverage items that need no judge are known at once.
        given_q = sample.questions if sample.questions is not None else self.questions
        given_f = sample.key_facts if sample.key_facts is not None else self.key_facts
        if given_q is not None and len(given_q) == 0:
            given_q = None  # DeepEval: empty assessment questions mean "generate them"
        if given_q is not None:
            coverage_from, items, ask = "user_questions", list(given_q), "question"
        elif given_f is not None:
            coverage_from, items, ask = "key_facts", list(given_f), "statement"
        elif d["coverage"] == "key_sentences":
            coverage_from, items, ask = "key_sentences", key_sentences(sample.source, self.key_sentences), "statement"
        else:
            coverage_from, items, ask = "questions", None, "question"

        # A source too long for the judge's context is split on sentence boundaries, so that each piece fits a
        # verdict request about the longest claim the summary could hold (and a questions request, if asked).
        longest = "x" * self.max_text_chars
        if d["claims"] == "sentences":
            longest = max(summary_sentences(sample.summary) or [longest], key=len)

        def carriers(text: str) -> list[StageRequest]:
            reqs = [self._verdict(sid, "support", text, longest)[0]]
            if items is None:
                reqs.append(
                    StageRequest(
                        sid,
                        "questions",
                        tuple(prompts.questions_prompt(text, n=self.max_questions, style=d["prompt_style"])),
                        schemas.questions_list(self.max_questions, self.max_text_chars),
                    )
                )
            return reqs

        pieces = self.source_pieces(sample.source, carriers)
        exact = self.flavor == "deepeval"
        asking = (
            [(k, n) for k, n in enumerate(allot(self.max_questions, [len(p) for p in pieces])) if n > 0]
            if items is None
            else []
        )
        parts = (
            [" ".join(part) for part in _groups(summary_sentences(sample.summary), CLAIM_PART_SENTENCES)]
            if d["claims"] == "atomic"
            else []
        )
        claims = summary_sentences(sample.summary) if d["claims"] == "sentences" else None
        wave = [self._claims_request(sample.id, part) for part in parts]
        wave += [
            StageRequest(
                sample.id,
                "questions",
                tuple(prompts.questions_prompt(pieces[k], n=n, exact=exact, style=d["prompt_style"])),
                schemas.questions_list(n, self.max_text_chars, n if exact else 1),
            )
            for k, n in asking
        ]
        dropped: list[dict] = []
        if wave:
            results = yield wave
            if parts:
                claims = yield from self._atomic_claims(sample.id, parts, results[: len(parts)], stages)
            if items is None:
                drawn = [
                    q
                    for (k, _), r in zip(asking, results[len(parts) :])
                    for q in require(r, stages, "questions" if len(pieces) == 1 else f"questions.{k}").questions
                ]
                items, dropped = distinct_questions(drawn)
        asked = items[: self.max_questions] if self.flavor == "mastra" else items

        # Wave 2: every verdict, each claim and each item alone.
        wave = [req for claim in claims for piece in pieces for req in self._verdict(sid, "support", piece, claim)]
        for item in asked:
            wave += self._verdict(
                sid,
                "coverage",
                sample.summary,
                item,
                ask if ask == "statement" or self.flavor == "mastra" else "answerable",
            )
            if self.flavor == "deepeval" and ask == "question":
                wave += [
                    req for piece in pieces for req in self._verdict(sid, "source_answer", piece, item, "answerable")
                ]
        replies = (yield wave) if wave else []

        at, judged = 0, []
        for i, claim in enumerate(claims):
            found = []
            for k in range(len(pieces)):
                key = f"support.{i}" if len(pieces) == 1 else f"support.{i}.{k}"
                found.append(self._read(replies[at : at + width], stages, key))
                at += width
            best = max(range(len(pieces)), key=lambda k: (found[k]["verdict"], found[k]["p"] or 0))
            entry = {"claim": claim, "supported": found[best]["verdict"], "p_supported": found[best]["p"]}
            entry.update({k: v for k, v in found[best].items() if k in ("reason", "pmi")})
            if len(pieces) > 1:
                entry["piece"] = best if found[best]["verdict"] else None
                entry["p_by_piece"] = [f["p"] for f in found]  # the claim checked against each piece of the source
            judged.append(entry)
        verdicts: list[dict] = []
        for j in range(len(asked)):
            got = self._read(replies[at : at + width], stages, f"coverage.{j}")
            at += width
            verdict = {"answered": got["verdict"], "p_answered": got["p"]}
            verdict.update({k: v for k, v in got.items() if k in ("reason", "pmi")})
            if self.flavor == "deepeval" and ask == "question":
                sources = []
                for k in range(len(pieces)):
                    sources.append(
                        self._read(
                            replies[at : at + width],
                            stages,
                            f"source_answer.{j}" if len(pieces) == 1 else f"source_answer.{j}.{k}",
                        )
                    )
                    at += width
                verdict["source_answered"] = any(s["verdict"] for s in sources)
            verdicts.append(verdict)

        value = two_axis_score(
            judged,
            items,
            verdicts,
            max_questions=self.max_questions if self.flavor == "mastra" else max(len(items), 1),
            scale=self.scale,
            strict_mode=self.strict_mode,
            threshold=self.threshold,
            flavor=self.flavor,
        )
        noun = {
            "questions": "questions",
            "user_questions": "questions",
            "key_facts": "key facts",
            "key_sentences": "key sentences of the source",
        }[coverage_from]
        reason = (
            compose_reason(
                value.score,
                value.alignment,
                value.coverage,
                value.limiting_axis,
                judged,
                asked,
                verdicts,
                self.strict_mode,
                noun,
            )
            if self.include_reason
            else None
        )
        counted = [v for v in verdicts if v.get("source_answered", True)]
        return SummarizationResult(
            id=sample.id,
            score=value.score,
            reason=reason,
            alignment=value.alignment,
            coverage=value.coverage,
            limiting_axis=value.limiting_axis,
            passed=value.passed,
            claims=judged,
            questions=items,
            coverage_from=coverage_from,
            coverage_verdicts=verdicts,
            dropped_questions=dropped,
            soft_alignment=soft_score([c["p_supported"] for c in judged]),
            soft_coverage=soft_score([v["p_answered"] for v in counted]),
            source_pieces=len(pieces),
            settings=dict(self.settings, **{f"design.{k}": v for k, v in d.items()}),
            stages=stages,
        )

    def _claims_request(self, sample_id: str, part: str) -> StageRequest:
        return StageRequest(
            sample_id,
            "claims",
            tuple(prompts.claims_prompt(part, style=self.design["prompt_style"])),
            schemas.claims_list(self.max_claims, self.max_text_chars),
        )

    def _atomic_claims(self, sample_id: str, parts: list[str], results: list[StageResult], stages: dict):
        """The claims of every part; a part whose list reached the bound is asked again in two halves (a wave
        more), down to a single sentence, which then fails loudly: claims are never cut."""
        claims_of: list[list[str] | None] = []
        raws = [r.raw_output for r in results]
        for k, result in enumerate(results):
            found = list(require(result, stages, "claims" if len(parts) == 1 else f"claims.{k}").claims)
            claims_of.append(None if len(found) >= self.max_claims else found)
        round_ = 0
        while any(c is None for c in claims_of):
            round_ += 1
            full = [k for k, c in enumerate(claims_of) if c is None]
            halves = {k: _halves(parts[k]) for k in full}
            for k in full:
                if len(halves[k]) < 2:
                    raise JudgeOutputError(
                        f"the judge listed {self.max_claims} claims, the bound, for one sentence of the summary",
                        stage="claims",
                        raw_output=raws[k],
                        sample_id=sample_id,
                        kind=Failure.BOUND,
                    )
            replies = yield [self._claims_request(sample_id, half) for k in full for half in halves[k]]
            new_parts, new_claims, new_raws, at = [], [], [], 0
            for k, part in enumerate(parts):
                if claims_of[k] is not None:
                    new_parts.append(part)
                    new_claims.append(claims_of[k])
                    new_raws.append(raws[k])
                    continue
                for half in halves[k]:
                    found = list(require(replies[at], stages, f"claims.split{round_}.{at}").claims)
                    new_parts.append(half)
                    new_claims.append(None if len(found) >= self.max_claims else found)
                    new_raws.append(replies[at].raw_output)
                    at += 1
            parts, claims_of, raws = new_parts, new_claims, new_raws
        return [c for part in claims_of for c in part]


def _halves(part: str) -> list[str]:
    """A part of the summary in two halves of whole sentences (one sentence stays whole: it cannot be halved)."""
    found = summary_sentences(part)
    middle = (len(found) + 1) // 2
    return [" ".join(found[:middle]), " ".join(found[middle:])] if len(found) > 1 else [part]


def _groups(items: list[str], size: int) -> list[list[str]]:
    return [items[k : k + size] for k in range(0, len(items), size)] or [[]]
