"""The verdict stage both metrics ask for: one statement (or question) against one text -> a verdict and its
P(yes). A yes-no request (a YesNoVerdict, P(yes) read at its first token), or a likelihood request with its
baseline: the statement's PMI per token against the threshold, with the fact-conflict rules of likelihood.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from offline_sumscore.core.errors import UsageError
from offline_sumscore.core.figures import aligned_sentence
from offline_sumscore.core.prompts import fence, reason_line, two_axis
from offline_sumscore.core.schemas import Likelihood, TextOutput
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import first_prob, require
from offline_sumscore.scorers.stages.likelihood import CONFLICT_WEIGHT, typed_conflict, weakest_token

YES_NO = ("Y", "N")  # a YesNoVerdict's yes and no tokens start with these
LIKELIHOOD_THRESHOLD = 2.0  # nats per token; see SummarizationScorer's likelihood_threshold parameter


def statement_prompt(text: str, statement: str, *, with_reason: bool = False, style: str = "full") -> list[dict]:
    """A yes-no verdict: is the statement supported by the text? Stage "support" (text: the source, or one piece
    of a long one; statement: a claim) and stage "coverage" for statements (text: the summary; statement: a key
    fact or key sentence of the source). Opens with the text, so every statement checked against it shares it."""
    return two_axis(
        f"{fence('article', text)}\n\n{fence('statement', statement)}\n\n"
        f"Is the statement fully supported by the article? Answer Yes or No.{reason_line(with_reason)}",
        style,
    )


# The instruction a likelihood statement is scored after. A quote asks for a copy, and a summary that is a single
# sentence (XSum's kind: a whole article in one line) is not one, so it is asked as what it is, the judge's own
# one-sentence summary. Measured on the embedded judge (research/likelihood_prompts.py,
# results/likelihood_prompts.md): FRANK's BBC/XSum summaries, 138 of 140 a single sentence, rank better that way
# (AUC 0.688 -> 0.746; better in 97% of paired resamples of documents), while the sentences of longer summaries rank
# worse (SummEval: 0.463 -> 0.449 on the development documents, 0.371 -> 0.337 on the 48 nothing was chosen on), so
# they stay quotes. Chosen on FRANK: 21 one-sentence SummEval summaries rank a little better as quotes.
LIKELIHOOD_INSTRUCTION = "Quote one sentence stated in the article."
ONE_SENTENCE_SUMMARY_INSTRUCTION = "Summarize the article in one sentence."


def likelihood_prompt(text: str, *, style: str = "full", whole_summary: bool = False) -> list[dict]:
    """A likelihood verdict: the judge's reply is scored, not generated. The engine reads how likely the judge
    finds the statement (StageRequest.continuation) as its reply to this prompt; with text "" it is the statement's
    baseline (stage "baseline"), and the difference is how much the text raises it. whole_summary: the statement is
    a whole summary of one sentence, asked as the judge's one-sentence summary instead of a quote."""
    instruction = ONE_SENTENCE_SUMMARY_INSTRUCTION if whole_summary else LIKELIHOOD_INSTRUCTION
    return two_axis(f"{fence('article', text)}\n\n{instruction}", style)


def question_prompt(summary: str, question: str, *, with_reason: bool = False, style: str = "full") -> list[dict]:
    """Stage "coverage" for questions (Mastra's semantics): the judge sees the summary and the question, never the
    source. Yes only if the summary states the answer yes; no if it leaves it out or says something different."""
    return two_axis(
        f"{fence('summary', summary)}\n\n{fence('question', question)}\n\n"
        "Using only the summary: does the summary state that the answer to the question is yes? Answer No if the "
        f"summary leaves it out or says something different. Answer Yes or No.{reason_line(with_reason)}",
        style,
    )


def answerable_prompt(text: str, question: str, *, with_reason: bool = False, style: str = "full") -> list[dict]:
    """Stage "coverage" and "source_answer" for DeepEval's semantics: does the text (the summary, or the source)
    hold enough information to answer the question? DeepEval asks this of both and counts only the questions
    the source answers."""
    return two_axis(
        f"{fence('text', text)}\n\n{fence('question', question)}\n\n"
        "Does the text contain enough information to answer the question? Answer Yes or No."
        f"{reason_line(with_reason)}",
        style,
    )


class YesNoVerdict(TextOutput):
    """Stages "support" and "coverage" with yes-no verdicts: "Yes" or "No", then (when asked) a reason on the next
    line. The verdict is the first token, so it is read from one next-token distribution, and the reason, decoded
    after it, can only explain it."""

    verdict: bool
    reason: str | None = None
    reason_chars: ClassVar[int | None] = None

    @classmethod
    def lark(cls) -> str:
        if not cls.reason_chars:
            return 'start: "Yes" | "No"'
        return 'start: ("Yes" | "No") "\\nReason: " /[^\\n]{1,' + str(cls.reason_chars) + "}/"

    @classmethod
    def gbnf(cls) -> str:
        if not cls.reason_chars:
            return 'root ::= "Yes" | "No"'
        return 'root ::= ("Yes" | "No") "\\nReason: " [^\\n]{1,' + str(cls.reason_chars) + "}"

    @classmethod
    def from_text(cls, text: str) -> YesNoVerdict:
        word, _, rest = text.partition("\n")
        if word not in ("Yes", "No"):
            raise ValueError(f"a verdict must be Yes or No; got {text[:20]!r}")
        # The grammar makes a local judge give the reason it was asked for; a served judge's missing reason costs
        # only the explanation, never the verdict.
        reason = rest[len("Reason: ") :] if rest.startswith("Reason: ") else (rest.strip() or None)
        return cls(verdict=word == "Yes", reason=reason)


@cache
def yes_no_verdict(reason_chars: int | None) -> type[YesNoVerdict]:
    return type(f"YesNoVerdict{reason_chars or ''}", (YesNoVerdict,), {"reason_chars": reason_chars})


@dataclass(frozen=True)
class VerdictStage:
    """One verdict's requests and their reading, in the design the scorer resolved."""

    verdicts: str  # "yes-no" or "likelihood"
    style: str  # core/prompts.STYLES
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
                    tuple(likelihood_prompt(context, style=self.style, whole_summary=whole_summary)),
                    Likelihood,
                    continuation=statement,
                )
                for name, context in ((stage, text), ("baseline", ""))
            ]
        render = {"statement": statement_prompt, "question": question_prompt, "answerable": answerable_prompt}[ask]
        return [
            StageRequest(
                sample_id,
                stage,
                tuple(render(text, statement, with_reason=self.reasons, style=self.style)),
                yes_no_verdict(self.max_reason_chars if self.reasons else None),
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
