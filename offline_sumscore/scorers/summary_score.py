"""SummaryScore: the Ragas-style summary score on a local judge.

Waves per sample:
  1. "keyphrases"      (text): people, organisations, locations, dates/times, money, percentages.
  2. "ragas_questions" (text + keyphrases): closed questions the text answers "1".
  3. "ragas_answers"   (summary + one question, never the text): "1" or "0", one request per question.
text = the reference contexts joined with "\\n". QA = answers "1" / answers returned;
conciseness = 1 - min(len(summary), len(text)) / (len(text) + 1e-10) in characters;
score = QA*(1-coeff) + conciseness*coeff with length_penalty, else QA. Not rounded.

The tiny-judge mode (answers="likelihood", what "auto" picks for the embedded judge): the embedded 135M judge answers
"1" to anything (QA 1.0 on every SummEval item: Spearman 0.04 with the experts' mean), so instead of keyphrases and
questions it takes the text's first key_sentences sentences as the items, and checks each against the summary by
likelihood, as the two-axis coverage does (scorers/stages/verdict.py): an item's answer is "1" when the summary
makes the judge expect the sentence (its verdict score at least 2.0 nats per token), and its P("1") the sigmoid of
the margin. Keyphrases are then empty and the questions are those sentences; the rows' settings record the mode.

Zero answers: Ragas divides by zero there. Here it cannot arise from the judge (the question schema asks for
at least one question and the answer schema for exactly one answer per question); in rescoring
(arithmetic.summary_score) it is a ValueError, never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offline_sumscore.core import prompts
from offline_sumscore.core.arithmetic import join_contexts, summary_score
from offline_sumscore.core.coverage_items import key_sentences
from offline_sumscore.core.errors import UsageError, check_count
from offline_sumscore.core.results import SummaryScoreResult
from offline_sumscore.core.samples import Sample, checked_sample, is_empty_summary
from offline_sumscore.core.source_pieces import allot
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.scorers.base import Plan, ScorerBase, first_prob, soft_score
from offline_sumscore.scorers.reasons import EMPTY_SUMMARY_REASON
from offline_sumscore.scorers.stages.answers import answer_read, answer_request
from offline_sumscore.scorers.stages.keyphrases import KEYPHRASE_RULE, keyphrases_read, keyphrases_request
from offline_sumscore.scorers.stages.likelihood import LIKELIHOOD_RULE
from offline_sumscore.scorers.stages.questions import questions_read, ragas_questions_request
from offline_sumscore.scorers.stages.verdict import LIKELIHOOD_THRESHOLD, VerdictStage
from offline_sumscore.scorers.waves import Wave

SAFETY_BOUND = 50  # keyphrases and questions per list: Ragas sets no number; this only stops a degenerate list
ANSWERS = ("auto", "questions", "likelihood")
# The tiny-judge mode's check: the embedded judge's likelihood verdict, bare prompt, at the two-axis threshold.
LIKELIHOOD = VerdictStage("likelihood", "bare", False, 0, LIKELIHOOD_THRESHOLD)


class SummaryScore(ScorerBase):
    """Ragas-style SummaryScore on a local judge.

    Parameters
    ----------
    model : path to a model directory or .gguf file, a loaded Judge, or None for the embedded default.
    length_penalty : weigh in conciseness (default on).
    coeff : weight of conciseness, in [0, 1] (default 0.5).
    max_questions, max_keyphrases : safety bounds on each list (default 50 each). As in Ragas, the judge chooses
        how many keyphrases and questions to write; the bounds only stop a degenerate list.
    max_text_chars : bound on each keyphrase and question.
    answers : "questions" (Ragas's design: keyphrases, questions, "1"/"0" answers from the summary), "likelihood"
        (the tiny-judge mode: the text's key sentences checked against the summary by likelihood), or "auto" (the
        judge's default: likelihood for the embedded judge, questions for a judge you bring).
    key_sentences : with answers="likelihood", how many of the text's first sentences are checked (default 5).
    """

    metric = "summary-score"

    def __init__(
        self,
        model: Any = None,
        *,
        length_penalty: bool = True,
        coeff: float = 0.5,
        max_questions: int = SAFETY_BOUND,
        max_keyphrases: int = SAFETY_BOUND,
        max_text_chars: int = 200,
        answers: str = "auto",
        key_sentences: int = 5,
        **engine_options,
    ):
        super().__init__(model, **engine_options)
        if answers not in ANSWERS:
            raise UsageError(f"answers must be one of {', '.join(ANSWERS)}. Given: {answers!r}")
        check_count("key_sentences", key_sentences, 50)
        self.answers, self.key_sentences, self._answers_in_use = answers, key_sentences, None
        if not 0 <= coeff <= 1:
            raise UsageError(f"coeff must be between 0 and 1. Given: {coeff}")
        for name, value, most in (
            ("max_questions", max_questions, 200),
            ("max_keyphrases", max_keyphrases, 200),
            ("max_text_chars", max_text_chars, 10_000),
        ):
            check_count(name, value, most)
        self.length_penalty, self.coeff = length_penalty, coeff
        self.max_questions, self.max_keyphrases, self.max_text_chars = max_questions, max_keyphrases, max_text_chars

    @property
    def settings(self) -> dict[str, Any]:
        return {
            "length_penalty": self.length_penalty,
            "coeff": self.coeff,
            "max_questions": self.max_questions,
            "max_keyphrases": self.max_keyphrases,
            "max_text_chars": self.max_text_chars,
            "answers": self.answers,
            "key_sentences": self.key_sentences,
            "prompt_version": prompts.PROMPT_VERSION,
        }

    @property
    def answers_in_use(self) -> str:
        """answers, "auto" resolved from what the engine says of its judge (this loads the judge)."""
        if self._answers_in_use is None:
            embedded = self.stacked_engine.describe().get("judge", {}).get("embedded")
            self._answers_in_use = (
                self.answers if self.answers != "auto" else ("likelihood" if embedded else "questions")
            )
        return self._answers_in_use

    def score(
        self,
        source: str | Sequence[str] | None = None,
        summary: str | None = None,
        *,
        reference_contexts: Sequence[str] | None = None,
        response: str | None = None,
        id: str | None = None,
    ) -> SummaryScoreResult:
        """score(text, summary), or with Ragas's names: score(reference_contexts=[...], response=...)."""
        return self._score_one(self._sample(source, summary, reference_contexts, response, id))

    @staticmethod
    def _sample(source, summary, reference_contexts, response, id) -> Sample:
        if (source is None) == (reference_contexts is None):
            raise UsageError("give the text once: as source or as reference_contexts")
        if (summary is None) == (response is None):
            raise UsageError("give the summary once: as summary or as response")
        text = join_contexts(source if source is not None else reference_contexts)
        return checked_sample(
            id if id is not None else "0",
            text,
            summary if summary is not None else response,
            source_field="reference_contexts" if source is None else "source",
            summary_field="response" if summary is None else "summary",
            error_id=id,
            python=True,
        )

    def plan(self, sample: Sample) -> Plan:
        if is_empty_summary(sample.summary):
            return self._empty_summary_result(sample)
        if self.answers_in_use == "likelihood":
            return (yield from self._likelihood_plan(sample))
        stages: dict[str, dict] = {}

        def questions_request(text: str, keyphrases: list[str], n: int) -> StageRequest:
            return ragas_questions_request(sample.id, text, keyphrases, n, max_text_chars=self.max_text_chars)

        # A text too long for the judge's context is split on sentence boundaries, sized on the questions prompt
        # with the longest keyphrase list; keyphrases and questions are drawn per piece in proportion to its length.
        # Keyphrases are names, dates and amounts: sized at 60 characters each, the bound's worth of them.
        longest = ["x" * min(self.max_text_chars, 60)] * self.max_keyphrases
        pieces = self.source_pieces(sample.source, lambda text: [questions_request(text, longest, self.max_questions)])
        key = (lambda stage, k: stage) if len(pieces) == 1 else (lambda stage, k: f"{stage}.{k}")
        weights = [len(p) for p in pieces]
        drawing = [(k, n) for k, n in enumerate(allot(self.max_keyphrases, weights)) if n > 0]
        wave = Wave(sample.id)
        for k, n in drawing:
            wave.ask(("keyphrases", k), keyphrases_request(sample.id, pieces[k], n, max_text_chars=self.max_text_chars))
        replies = wave.replies((yield wave.requests))
        found = {
            k: keyphrases_read(replies.one(("keyphrases", k)), stages, key("keyphrases", k), pieces[k])
            for k, _ in drawing
        }
        keyphrases = [phrase for k, _ in drawing for phrase in found[k]]
        asking = [(k, n) for k, n in enumerate(allot(self.max_questions, weights)) if n > 0]
        wave = Wave(sample.id)
        for k, n in asking:
            wave.ask(("questions", k), questions_request(pieces[k], found.get(k, []), n))
        replies = wave.replies((yield wave.requests))
        questions = [
            q
            for k, _ in asking
            for q in questions_read(replies.one(("questions", k)), stages, key("ragas_questions", k))
        ]
        # One request per question: the summary is their shared prefix, computed once by the engine.
        wave = Wave(sample.id)
        for i, q in enumerate(questions):
            wave.ask(("answer", i), answer_request(sample.id, sample.summary, q))
        replies = wave.replies((yield wave.requests) if wave.requests else [])
        answered = [replies.one(("answer", i)) for i in range(len(questions))]
        answers = [answer_read(r, stages, f"ragas_answers.{i}") for i, r in enumerate(answered)]
        p_yes = [first_prob(r) for r in answered]
        return self._result(sample, keyphrases, questions, answers, p_yes, stages, source_pieces=len(pieces))

    def _likelihood_plan(self, sample: Sample) -> Plan:
        """The tiny-judge mode: the text's key sentences, each checked against the summary by likelihood."""
        stages: dict[str, dict] = {}
        items = key_sentences(sample.source, self.key_sentences)  # never empty: a sample's source has text
        wave = Wave(sample.id)
        for i, item in enumerate(items):
            wave.ask(("answer", i), LIKELIHOOD.requests(sample.id, "ragas_answers", sample.summary, item))
        replies = wave.replies((yield wave.requests))
        got = [
            LIKELIHOOD.read(replies.of(("answer", i)), stages, f"ragas_answers.{i}", sample.summary)
            for i in range(len(items))
        ]
        answers, p_yes = ["1" if g["verdict"] else "0" for g in got], [g["p"] for g in got]
        return self._result(sample, [], items, answers, p_yes, stages)

    def _empty_summary_result(self, sample: Sample) -> SummaryScoreResult:
        """An empty summary answers nothing: score 0 (core.arithmetic.summary_score says so for any empty summary),
        with no keyphrases, questions or answers asked of the judge, and the reason saying why."""
        result = self._result(sample, [], [], [], [], {})
        result.reason, result.empty_summary, result.soft_qa = EMPTY_SUMMARY_REASON, True, 0.0
        return result

    @property
    def design(self) -> dict[str, Any]:
        """The design every row of this scorer records under settings' design.* (an empty summary's row too, so that
        the rows of one run compare): the answers mode in use and the rule it runs by."""
        if self.answers_in_use == "likelihood":
            return {"answers": "likelihood", "likelihood_rule": LIKELIHOOD_RULE}
        return {"answers": "questions", "keyphrase_rule": KEYPHRASE_RULE}

    def _result(
        self, sample: Sample, keyphrases, questions, answers, p_yes, stages: dict, source_pieces: int = 1
    ) -> SummaryScoreResult:
        """The score from the answers (core.arithmetic.summary_score, pure), with every intermediate kept."""
        value = summary_score(
            answers, sample.source, sample.summary, length_penalty=self.length_penalty, coeff=self.coeff
        )
        return SummaryScoreResult(
            id=sample.id,
            score=value.score,
            qa=value.qa,
            conciseness=value.conciseness,
            keyphrases=keyphrases,
            questions=questions,
            answers=answers,
            answer_p_yes=p_yes,
            soft_qa=soft_score(p_yes),
            source_pieces=source_pieces,
            settings=dict(self.settings, **{f"design.{k}": v for k, v in self.design.items()}),
            stages=stages,
        )
