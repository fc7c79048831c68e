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
  same without the text (stage "baseline"): how much the text makes the judge expect the statement (PMI), less
  the PMI of its worst fact conflict (a number, name or negation where the text makes the judge confident of
  another token: scorers/stages/likelihood.typed_conflict). The verdict is that score >= likelihood_threshold nats
  per token and P(yes) = sigmoid(score - threshold); the entry keeps the mean PMI, the conflict and the score.
The defaults follow the judge (design.EMBEDDED_STAGES, BROUGHT_STAGES); each row's settings record the choice.

Then pure arithmetic (arithmetic.two_axis_score) in the chosen flavor. The reason is composed from the verdicts,
not generated: it costs no tokens and cannot contradict them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offline_sumscore.core import prompts
from offline_sumscore.core.arithmetic import FLAVORS, two_axis_score
from offline_sumscore.core.coverage_items import distinct_questions, key_sentences, summary_sentences
from offline_sumscore.core.errors import Failure, JudgeOutputError, UsageError, check_count
from offline_sumscore.core.results import SummarizationResult
from offline_sumscore.core.samples import Sample, checked_sample, is_empty_summary
from offline_sumscore.core.source_pieces import allot
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import Plan, ScorerBase, soft_score
from offline_sumscore.scorers.design import SOFT_COVERAGE, rules_recorded, stage_defaults
from offline_sumscore.scorers.reasons import EMPTY_SUMMARY_REASON, compose_reason
from offline_sumscore.scorers.stages.claims import claims_read, claims_request
from offline_sumscore.scorers.stages.likelihood import LIKELIHOOD_RULE
from offline_sumscore.scorers.stages.questions import questions_read, questions_request
from offline_sumscore.scorers.stages.verdict import LIKELIHOOD_THRESHOLD, VerdictStage
from offline_sumscore.scorers.two_axis_stages import (
    ITEM_NOUNS,
    Coverage,
    figure_checked,
    figures_beyond_claims,
    groups,
    halves,
    relations_checked,
)
from offline_sumscore.scorers.waves import Wave

CLAIM_PART_SENTENCES = 8  # atomic claims are asked of at most this many summary sentences at a time
CLAIMS_BOUND = 64  # safety bound of one claims list; a list that reaches it is asked again in halves
VERDICT_DETAILS = ("reason", "pmi", "evidence", "conflict", "verdict_score")  # kept in each claim's and item's entry
CLAIMS_MODES = ("atomic", "sentences")
COVERAGE_MODES = ("questions", "key_sentences")
VERDICT_MODES = ("yes-no", "likelihood")


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
            defaults = stage_defaults(self.stacked_engine.describe().get("judge", {}))

            def pick(given: str, key: str) -> str:
                return given if given != "auto" else defaults[key]

            design = {
                "claims": pick(self.claims_mode, "claims"),
                "coverage": pick(self.coverage_mode, "coverage"),
                "verdicts": pick(self.verdicts, "verdicts"),
                "prompt_style": pick(self.prompt_style, "prompt_style"),
            }
            design["verdict_reasons"] = self.include_reason and design["verdicts"] == "yes-no"
            design.update(rules_recorded(design))
            if design["verdicts"] == "likelihood":
                design["likelihood_threshold"] = self.likelihood_threshold
                design["likelihood_rule"] = LIKELIHOOD_RULE
                if design["coverage"] == "key_sentences":
                    design["coverage_rule"] = SOFT_COVERAGE
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
    @property
    def verdict_stage(self) -> VerdictStage:
        d = self.design
        return VerdictStage(
            d["verdicts"], d["prompt_style"], d["verdict_reasons"], self.max_reason_chars, self.likelihood_threshold
        )

    def plan(self, sample: Sample) -> Plan:
        """A sample's stages, as named steps:
        1. what coverage is checked against: the user's questions or key facts, key sentences, or questions the
           judge draws from the source;
        2. the source, whole or in pieces that each fit the judge's context;
        3. the claims and the drawn questions (one wave, when either needs the judge);
        4. every verdict, each claim and each coverage item alone (one wave);
        5. every figure of the summary that no claim kept, checked against the source (figures_beyond_claims);
        6. the score, its reason and the result (pure arithmetic).
        An empty summary stops after step 1: it scores 0 without a stage (_empty_summary_result)."""
        stages: dict[str, dict] = {}
        coverage = self._coverage(sample)
        if is_empty_summary(sample.summary):
            return self._empty_summary_result(sample, coverage)
        pieces = self._pieces(sample, coverage)
        claims = yield from self._claims_and_questions(sample, pieces, coverage, stages)
        judged, verdicts = yield from self._verdicts(sample, pieces, claims, coverage, stages)
        added, unclaimed = figures_beyond_claims(sample.summary, sample.source, judged)
        return self._result(sample, pieces, judged + added, coverage, verdicts, stages, unclaimed)

    def _empty_summary_result(self, sample: Sample, coverage: Coverage) -> SummarizationResult:
        """An empty summary states nothing and covers nothing: no claim to check and no item it could answer, so the
        judge is asked nothing (questions drawn from the source would go unanswered). The items known without the
        judge (the user's questions or key facts, the source's key sentences) are kept, each unanswered. The score
        comes from the arithmetic every row's does (no claims: 0), so rescoring the row gives 0 again."""
        coverage.items = coverage.items or []
        verdicts = [{"answered": False, "p_answered": 0.0} for _ in self._asked(coverage)]
        result = self._result(sample, [sample.source], [], coverage, verdicts, {}, [])
        result.reason, result.empty_summary = (EMPTY_SUMMARY_REASON if self.include_reason else None), True
        # 0 as the score is, not None (no P(yes) was read): a comparison keeps a field only where every row has it.
        result.soft_alignment = result.soft_coverage = 0.0
        return result

    def _coverage(self, sample: Sample) -> Coverage:
        given_q = sample.questions if sample.questions is not None else self.questions
        given_f = sample.key_facts if sample.key_facts is not None else self.key_facts
        if given_q:  # DeepEval: empty assessment questions mean "generate them"
            return Coverage("user_questions", list(given_q), "question")
        if given_f is not None:
            return Coverage("key_facts", list(given_f), "statement")
        if self.design["coverage"] == "key_sentences":
            return Coverage("key_sentences", key_sentences(sample.source, self.key_sentences), "statement")
        return Coverage("questions", None, "question")

    def _pieces(self, sample: Sample, coverage: Coverage) -> list[str]:
        """A source too long for the judge's context is split on sentence boundaries, so that each piece fits a
        verdict request about the longest claim the summary could hold (and a questions request, if asked)."""
        longest, whole = "x" * self.max_text_chars, False
        if self.design["claims"] == "sentences":
            sentences = summary_sentences(sample.summary)
            longest, whole = max(sentences or [longest], key=len), len(sentences) == 1

        def carriers(text: str) -> list[StageRequest]:
            reqs = [self.verdict_stage.requests(sample.id, "support", text, longest, whole_summary=whole)[0]]
            if coverage.items is None:
                reqs.append(self._questions_request(sample.id, text, self.max_questions))
            return reqs

        return self.source_pieces(sample.source, carriers)

    def _claims_and_questions(self, sample: Sample, pieces: list[str], coverage: Coverage, stages: dict):
        """The claims (the summary's sentences, or atomic claims the judge lists per part of the summary) and, when
        coverage needs them, the questions the judge draws from each piece (into coverage.items and .dropped)."""
        sentences = summary_sentences(sample.summary)
        atomic = self.design["claims"] == "atomic"
        parts = [" ".join(part) for part in groups(sentences, CLAIM_PART_SENTENCES)] if atomic else []
        asking = []
        if coverage.items is None:
            asking = [(k, n) for k, n in enumerate(allot(self.max_questions, [len(p) for p in pieces])) if n > 0]
        wave = Wave(sample.id)
        for k, part in enumerate(parts):
            wave.ask(("claims", k), self._claims_request(sample.id, part))
        exact = self.flavor == "deepeval"
        for k, n in asking:
            wave.ask(("questions", k), self._questions_request(sample.id, pieces[k], n, exact=exact))
        if not wave.requests:
            return sentences
        replies = wave.replies((yield wave.requests))
        claims = sentences
        if parts:
            asked = [replies.one(("claims", k)) for k in range(len(parts))]
            claims = yield from self._atomic_claims(sample.id, parts, asked, stages)
        if coverage.items is None:
            drawn = [
                q
                for k, _ in asking
                for q in questions_read(
                    replies.one(("questions", k)), stages, "questions" if len(pieces) == 1 else f"questions.{k}"
                )
            ]
            coverage.items, coverage.dropped = distinct_questions(drawn)
        return claims

    def _verdicts(self, sample: Sample, pieces: list[str], claims: list[str], coverage: Coverage, stages: dict):
        """Every claim against every piece of the source, every counted item against the summary (and, for
        DeepEval's flavor, each question against the source). Returns the judged claims and the items' verdicts."""
        verdict, sid, asked = self.verdict_stage, sample.id, self._asked(coverage)
        deepeval_q = self.flavor == "deepeval" and coverage.ask == "question"
        ask = coverage.ask if coverage.ask == "statement" or self.flavor == "mastra" else "answerable"
        # A summary of one sentence, whose claim is that sentence, is asked as the judge's one-sentence summary of
        # the source, not as a quote from it (stages/verdict.likelihood_prompt). Claims in "sentences" mode are the
        # summary's sentences (_claims_and_questions).
        whole = self.design["claims"] == "sentences" and len(claims) == 1
        wave = Wave(sid)
        for i, claim in enumerate(claims):
            for k, piece in enumerate(pieces):
                wave.ask(("support", i, k), verdict.requests(sid, "support", piece, claim, whole_summary=whole))
        for j, item in enumerate(asked):
            wave.ask(("coverage", j), verdict.requests(sid, "coverage", sample.summary, item, ask))
            if deepeval_q:
                for k, p in enumerate(pieces):
                    wave.ask(("source_answer", j, k), verdict.requests(sid, "source_answer", p, item, "answerable"))
        replies = wave.replies((yield wave.requests) if wave.requests else [])
        judged = [self._judged_claim(claim, i, pieces, replies, stages, sample) for i, claim in enumerate(claims)]
        verdicts = []
        for j in range(len(asked)):
            got = verdict.read(replies.of(("coverage", j)), stages, f"coverage.{j}", sample.summary)
            entry = {"answered": got["verdict"], "p_answered": got["p"]}
            entry.update({k: v for k, v in got.items() if k in VERDICT_DETAILS})
            if deepeval_q:
                keys = [f"source_answer.{j}" + (f".{k}" if len(pieces) > 1 else "") for k in range(len(pieces))]
                answers = [
                    verdict.read(replies.of(("source_answer", j, k)), stages, key, p)
                    for k, (key, p) in enumerate(zip(keys, pieces))
                ]
                entry["source_answered"] = any(a["verdict"] for a in answers)
            verdicts.append(entry)
        return judged, verdicts

    def _judged_claim(self, claim: str, i: int, pieces: list[str], replies, stages: dict, sample) -> dict:
        """A claim's entry: supported when any piece of the source supports it (the most confident piece wins), and
        then the figure check's word on it (figure_checked), and the roles' and quantity words' (relations_checked)."""
        verdict, n_pieces = self.verdict_stage, len(pieces)
        keys = [f"support.{i}" + (f".{k}" if n_pieces > 1 else "") for k in range(n_pieces)]
        found = [
            verdict.read(replies.of(("support", i, k)), stages, key, p) for k, (key, p) in enumerate(zip(keys, pieces))
        ]
        best = max(range(n_pieces), key=lambda k: (found[k]["verdict"], found[k]["p"] or 0))
        entry = {"claim": claim, "supported": found[best]["verdict"], "p_supported": found[best]["p"]}
        entry.update({k: v for k, v in found[best].items() if k in VERDICT_DETAILS})
        if n_pieces > 1:
            entry["piece"] = best if found[best]["verdict"] else None
            entry["p_by_piece"] = [f["p"] for f in found]  # the claim checked against each piece of the source
        return relations_checked(figure_checked(entry, sample.source), sample.source, sample.summary)

    def _asked(self, coverage: Coverage) -> list[str]:
        """The items verdicts are asked for: Mastra counts at most max_questions of them."""
        return coverage.items[: self.max_questions] if self.flavor == "mastra" else coverage.items

    def _result(self, sample, pieces, judged, coverage: Coverage, verdicts, stages, unclaimed) -> SummarizationResult:
        """The score from the verdicts (arithmetic.two_axis_score), the reason composed from them, every verdict."""
        items = coverage.items
        soft = self.design.get("coverage_rule") == SOFT_COVERAGE and coverage.source == "key_sentences"
        value = two_axis_score(
            judged,
            items,
            verdicts,
            max_questions=self.max_questions if self.flavor == "mastra" else max(len(items), 1),
            scale=self.scale,
            strict_mode=self.strict_mode,
            threshold=self.threshold,
            flavor=self.flavor,
            soft=soft,
        )
        reason = None
        if self.include_reason:
            reason = compose_reason(
                value.score,
                value.alignment,
                value.coverage,
                value.limiting_axis,
                judged,
                self._asked(coverage),
                verdicts,
                self.strict_mode,
                ITEM_NOUNS[coverage.source],
                soft_coverage=soft,
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
            coverage_from=coverage.source,
            coverage_verdicts=verdicts,
            dropped_questions=coverage.dropped,
            unclaimed_figures=unclaimed,
            soft_alignment=soft_score([c["p_supported"] for c in judged]),
            soft_coverage=soft_score([v["p_answered"] for v in counted]),
            source_pieces=len(pieces),
            settings=dict(self.settings, **{f"design.{k}": v for k, v in self.design.items()}),
            stages=stages,
        )

    def _claims_request(self, sample_id: str, part: str) -> StageRequest:
        return claims_request(
            sample_id,
            part,
            style=self.design["prompt_style"],
            max_claims=self.max_claims,
            max_text_chars=self.max_text_chars,
        )

    def _questions_request(self, sample_id: str, text: str, n: int, exact: bool = False) -> StageRequest:
        return questions_request(
            sample_id, text, n, style=self.design["prompt_style"], max_text_chars=self.max_text_chars, exact=exact
        )

    def _atomic_claims(self, sample_id: str, parts: list[str], results: list[StageResult], stages: dict):
        """The claims of every part; a part whose list reached the bound is asked again in two halves (a wave
        more), down to a single sentence, which then fails loudly: claims are never cut."""
        claims_of: list[list[str] | None] = []
        raws = [r.raw_output for r in results]
        for k, result in enumerate(results):
            found = claims_read(result, stages, "claims" if len(parts) == 1 else f"claims.{k}")
            claims_of.append(None if len(found) >= self.max_claims else found)
        round_ = 0
        while any(c is None for c in claims_of):
            round_ += 1
            full = [k for k, c in enumerate(claims_of) if c is None]
            split = {k: halves(parts[k]) for k in full}
            for k in full:
                if len(split[k]) < 2:
                    raise JudgeOutputError(
                        f"the judge listed {self.max_claims} claims, the bound, for one sentence of the summary",
                        stage="claims",
                        raw_output=raws[k],
                        sample_id=sample_id,
                        kind=Failure.BOUND,
                    )
            wave = Wave(sample_id)
            for k in full:
                for h, half in enumerate(split[k]):
                    wave.ask(("half", k, h), self._claims_request(sample_id, half))
            replies = wave.replies((yield wave.requests))
            new_parts, new_claims, new_raws, at = [], [], [], 0
            for k, part in enumerate(parts):
                if claims_of[k] is not None:
                    new_parts.append(part)
                    new_claims.append(claims_of[k])
                    new_raws.append(raws[k])
                    continue
                for h, half in enumerate(split[k]):
                    reply = replies.one(("half", k, h))
                    found = claims_read(reply, stages, f"claims.split{round_}.{at}")
                    new_parts.append(half)
                    new_claims.append(None if len(found) >= self.max_claims else found)
                    new_raws.append(reply.raw_output)
                    at += 1
            parts, claims_of, raws = new_parts, new_claims, new_raws
        return [c for part in claims_of for c in part]
