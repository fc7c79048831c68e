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

    def read(self, replies: list[StageResult], stages: dict, key: str) -> dict:
        """One verdict from its replies: {"verdict", "p", "reason"?, "pmi"?}. Raises JudgeOutputError loudly."""
        if self.verdicts == "likelihood":
            text = require(replies[0], stages, key)
            base = require(replies[1], stages, f"{key}.baseline")
            pmi = text.mean_logprob - base.mean_logprob
            conflict = typed_conflict(text, base)
            score = pmi + CONFLICT_WEIGHT * conflict["pmi"] if conflict else pmi
            margin = score - self.likelihood_threshold
            out = {"verdict": margin >= 0, "p": 1 / (1 + math.exp(-margin)), "pmi": round(pmi, 6)}
            evidence = weakest_token(text, base)
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


# The likelihood verdict's rule: the mean PMI per token, less half the PMI of the worst fact conflict (below). Measured
# on the perturbation set and the labelled data (benchmarks/verdict_rules.py, results/verdict_rules.md): a changed
# number now fails 88% of the time instead of 3%, a changed date 62%, a negation 63%, while 97% of faithful
# paraphrases still pass, and FRANK, SummEval and REALSumm stay within their intervals.
CONFLICT_WEIGHT = 0.5
CONFLICT_CONFIDENCE = 0.5  # the judge's probability of the other token, given the text, for a conflict
LIKELIHOOD_RULE = (
    f"mean PMI + {CONFLICT_WEIGHT:g} x the PMI of the worst fact conflict "
    f"(number for number, name for name, or a negation on one side; p >= {CONFLICT_CONFIDENCE:g}); "
    "a summary of one sentence asked as a one-sentence summary, any other statement as a quote"
)
NEGATIONS = frozenset({"not", "n't", "never", "no", "nor", "cannot", "without"})


def fact_kind(text: str) -> str | None:
    """What a token would change if swapped: "number", "name" (capitalized), "negation"; None for other words."""
    word = text.strip().strip("\"'.,;:!?()")
    if not word:
        return None
    if any(c.isdigit() for c in word):
        return "number"
    if word.lower() in NEGATIONS or word.lower().endswith(("n't", "n’t")):
        return "negation"
    return "name" if word[0].isupper() else None


def swaps_a_fact(written: str, expected: str) -> bool:
    """A number where the judge expected another number, a name where it expected another name, or a negation on
    one side only (the sense flips). A pronoun for a name, a word for a number, "n't" for "not": a paraphrase, not a
    swap. `written` is the token with any contraction after it joined on (written_token)."""
    mine, theirs = fact_kind(written), fact_kind(expected)
    if "negation" in (mine, theirs):
        return mine != theirs
    return mine is not None and mine == theirs


def written_token(tokens: list[str], at: int) -> str:
    """Token `at` with the contraction the tokenizer cut off after it (' n' + "'t": " n't"; ' didn' + "'t"), so that
    a tokenized "did n't" is read as the negation it is, not as the word "n"."""
    word, end = tokens[at], at + 1
    while end < len(tokens) and (tokens[end][:1] in "'’" or word[-1:] in "'’") and tokens[end][:1].strip():
        word, end = word + tokens[end], end + 1
    return word


def word_around(tokens: list[str], at: int, instead: str) -> tuple[str, str]:
    """The whole word that token `at` is part of, and the same word with `instead` in its place ('2' of "27" with
    '1' instead: "27" and "17")."""
    start, end = at, at + 1
    while start > 0 and not tokens[start].startswith(" ") and tokens[start - 1][-1:].isalnum():
        start -= 1
    while end < len(tokens) and not tokens[end].startswith(" ") and tokens[end][:1].isalnum():
        end += 1
    before, after = "".join(tokens[start:at]), "".join(tokens[at + 1 : end])
    return (before + tokens[at] + after).strip(), (before + instead + after).strip()


def typed_conflict(text: Likelihood, base: Likelihood, confident: float = CONFLICT_CONFIDENCE) -> dict | None:
    """The statement's worst fact conflict: a token where the text makes the judge confident (p >= confident, 0.5 in
    the product) of another token of the same kind (swaps_a_fact), and which the text made less likely than it is
    without it (negative PMI). None where there is none (or the engine read no tokens: a scripted judge)."""
    if not text.token_logprobs or len(text.token_logprobs) != len(base.token_logprobs):
        return None
    worst = None
    rows = zip(text.token_texts, text.token_logprobs, base.token_logprobs, text.expected_texts, text.expected_logprobs)
    for at, (token, lp, bp, expected, elp) in enumerate(rows):
        if expected.strip() == token.strip() or math.exp(elp) < confident:
            continue
        if (
            swaps_a_fact(written_token(text.token_texts, at), expected)
            and lp - bp < 0
            and (worst is None or lp - bp < worst[1])
        ):
            worst = (at, lp - bp)
    if worst is None:
        return None
    at, pmi = worst
    word, expected_word = word_around(text.token_texts, at, text.expected_texts[at])
    return {
        "token": text.token_texts[at],
        "word": word,
        "at": at,
        "pmi": round(pmi, 3),
        "p": round(math.exp(text.token_logprobs[at]), 4),
        "expected": text.expected_texts[at],
        "expected_word": expected_word,
        "p_expected": round(math.exp(text.expected_logprobs[at]), 4),
    }


def weakest_token(text: Likelihood, base: Likelihood) -> dict | None:
    """The statement's token that the text made least likely against the judge's expectation without it (the
    lowest pointwise mutual information), the whole word it is part of, and the token the judge expected most there
    given the text: the words behind a likelihood verdict. None where the engine read no tokens (a scripted judge)."""
    if not text.token_logprobs or len(text.token_logprobs) != len(base.token_logprobs):
        return None
    pmis = [a - b for a, b in zip(text.token_logprobs, base.token_logprobs)]
    at = min(range(len(pmis)), key=pmis.__getitem__)
    token = text.token_texts[at]
    # A piece of a word is named by its word, a bare ' ' by the word it opens ("4"); punctuation stands for itself.
    punctuation = token.strip() and not any(ch.isalnum() for ch in token)
    return {
        "token": token,
        "word": token.strip() if punctuation else word_around(text.token_texts, at, text.expected_texts[at])[0],
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
