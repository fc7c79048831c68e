"""Metric arithmetic: pure functions over verdicts, counts and strings. Imports nothing from the package
and no model code, so saved results can be rescored anywhere.

Verdicts may be given as the library's own objects (anything with a `supported`/`answered` attribute),
as plain dicts as they appear in an output file, as booleans, or as strings ("yes"/"no", "1"/"0",
"true"/"false", and DeepEval's "idk", which counts as not supported). Anything else is a ValueError naming its
position.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from offline_sumscore.core.errors import check_count

_TRUE = {"yes", "1", "true"}
_FALSE = {"no", "0", "false", "idk"}  # "idk": DeepEval's "the source does not say", which counts against
_VERDICT_KEYS = ("supported", "answered", "verdict", "answer")


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, and 0.0 when the denominator is 0 (a score, never NaN)."""
    return numerator / denominator if denominator else 0.0


def round_half_up(value: float, digits: int = 2) -> float:
    """Round as JavaScript's Math.round does on value * 10**digits: halves go up, not to even.

    round_half_up(0.125) == 0.13 where Python's round(0.125, 2) == 0.12.
    """
    scaled = value * 10**digits
    whole = math.floor(scaled)
    # Compare the remainder instead of floor(scaled + 0.5): the addition itself can round up.
    if scaled - whole >= 0.5:
        whole += 1
    return whole / 10**digits


def verdict_is_yes(verdict: Any, position: int = 0) -> bool:
    """Read one verdict in any accepted shape as True (supported/answered) or False."""
    if isinstance(verdict, bool):
        return verdict
    if isinstance(verdict, int) and verdict in (0, 1):
        return bool(verdict)
    if isinstance(verdict, str):
        word = verdict.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(f"verdict {position}: {verdict!r} is not one of yes/no/idk, 1/0, true/false")
    if isinstance(verdict, dict):
        for key in _VERDICT_KEYS:
            if key in verdict:
                return verdict_is_yes(verdict[key], position)
        raise ValueError(f"verdict {position}: dict has none of the keys {', '.join(_VERDICT_KEYS)}")
    for key in _VERDICT_KEYS:
        if hasattr(verdict, key):
            return verdict_is_yes(getattr(verdict, key), position)
    raise ValueError(f"verdict {position}: cannot read a yes/no from {type(verdict).__name__}")


def alignment(claim_verdicts: Iterable[Any]) -> float:
    """Share of the summary's claims that the source supports; 0 when there are no claims."""
    flags = [verdict_is_yes(v, i) for i, v in enumerate(claim_verdicts)]
    return ratio(sum(flags), len(flags))


def coverage(coverage_verdicts: Sequence[Any], n_questions: int, max_questions: int = 10) -> float:
    """Share of the (capped) questions that the summary answers.

    Verdicts are matched to questions by position: only the first min(n_questions, max_questions)
    verdicts count, a missing verdict counts as unanswered, an extra one is ignored.
    """
    asked = min(n_questions, max_questions)
    answered = sum(verdict_is_yes(v, i) for i, v in enumerate(list(coverage_verdicts)[:asked]))
    return ratio(answered, asked)


def soft_coverage(coverage_verdicts: Sequence[Any], n_items: int, max_questions: int = 10) -> float:
    """The mean probability that the summary covers each of the (capped) items, read from each verdict's
    "p_answered" (its yes/no where it has none): the expected share covered, where coverage() counts the verdicts
    that cleared their threshold. A missing verdict counts as 0."""
    asked = min(n_items, max_questions)
    probs = []
    for i, v in enumerate(list(coverage_verdicts)[:asked]):
        p = v.get("p_answered") if isinstance(v, dict) else None
        probs.append(float(p) if p is not None else float(verdict_is_yes(v, i)))
    return ratio(sum(probs), asked)


def coverage_deepeval(coverage_verdicts: Sequence[Any]) -> float:
    """DeepEval's coverage: of the questions the source answers yes, the share the summary answers yes too; 0 when
    the source answers none. A verdict without a "source_answered" key counts as answered by the source (a key
    sentence or a given key fact is the source's by construction)."""
    counted = [v for v in coverage_verdicts if not isinstance(v, dict) or v.get("source_answered", True)]
    return ratio(sum(verdict_is_yes(v, i) for i, v in enumerate(counted)), len(counted))


_alignment, _coverage = alignment, coverage  # two_axis_score's parameters take these names

JS_EPSILON = 2.220446049250313e-16  # Number.EPSILON: the gap between 1 and the next double


def round_mastra(value: float) -> float:
    """Mastra's roundToTwoDecimals: Math.round((value + Number.EPSILON) * 100) / 100, in the same double
    arithmetic. The EPSILON lifts values that sit a hair under a half: round_mastra(0.285) == 0.29 where plain half-up
    on 0.285 * 100 (28.499999999999996) gives 0.28."""
    return round_half_up(value + JS_EPSILON, 2)


FLAVORS = ("mastra", "deepeval")


@dataclass(frozen=True)
class TwoAxisScore:
    score: float  # min(alignment, coverage) x scale: rounded as Mastra rounds (mastra), not rounded (deepeval)
    alignment: float  # unrounded, after strict mode
    coverage: float  # unrounded, after strict mode
    limiting_axis: str  # "alignment", "coverage" or "both"
    passed: bool  # min(alignment, coverage) >= threshold, on the 0..1 scale before `scale`
    scorable: bool = True  # False: no claims or nothing to cover, so the score is 0 whatever the other axis says


def two_axis_score(
    alignment: Iterable[Any],
    questions: Sequence[Any],
    coverage: Sequence[Any],
    *,
    max_questions: int = 10,
    scale: float = 1.0,
    strict_mode: bool = False,
    threshold: float = 0.5,
    flavor: str = "mastra",
    soft: bool = False,
) -> TwoAxisScore:
    """Recompute the two-axis score from saved verdicts: alignment = the claim verdicts, questions = the coverage
    items (questions, key facts or key sentences), coverage = their verdicts, as they appear in an output row.

    flavor="mastra" (Mastra's summarization scorer): coverage counts the first min(len(questions), max_questions)
      items, a missing verdict as unanswered; no claims or no items scores 0; score =
      round_mastra(min(alignment, coverage) x scale).
    flavor="deepeval" (DeepEval's SummarizationMetric): coverage counts only items the source answers yes
      (coverage_deepeval); no claims gives alignment 0; the score is not rounded.
    strict_mode (as DeepEval's): each axis is 0 unless it is 1, and passing needs a score of 1.
    soft: coverage is the mean probability that each item is covered (soft_coverage), not the share of verdicts that
      cleared their threshold: the embedded judge's design, whose likelihood verdicts on a short summary's key
      sentences rarely clear it (a summary of two sentences cannot make the judge expect five of the source's).
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {', '.join(FLAVORS)}. Given: {flavor}")
    check_count("max_questions", max_questions)
    if not scale > 0:
        raise ValueError(f"scale must be > 0. Given: {scale}")
    claims = list(alignment)
    a = _alignment(claims)
    if flavor == "mastra":
        c = (soft_coverage if soft else _coverage)(coverage, len(questions), max_questions)
        scorable = bool(claims) and min(len(questions), max_questions) > 0
    else:
        c = coverage_deepeval(coverage)
        scorable = True
    if strict_mode:
        a, c = (1.0 if a == 1 else 0.0), (1.0 if c == 1 else 0.0)
        threshold = 1.0
    low = min(a, c) if scorable else 0.0
    axis = "both" if a == c else ("alignment" if a < c else "coverage")
    score = round_mastra(low * scale) if flavor == "mastra" else low * scale
    return TwoAxisScore(
        score=score, alignment=a, coverage=c, limiting_axis=axis, passed=low >= threshold, scorable=scorable
    )


def join_contexts(text: str | Sequence[str]) -> str:
    """Ragas joins reference contexts with a newline."""
    return text if isinstance(text, str) else "\n".join(text)


def qa_score(answers: Sequence[Any]) -> float:
    """Share of answers that are "1". Zero answers is an error: with no questions, QA is undefined."""
    if len(answers) == 0:
        raise ValueError("no answers to score: QA is undefined without questions (Ragas divides by zero here)")
    return sum(verdict_is_yes(a, i) for i, a in enumerate(answers)) / len(answers)


def conciseness(summary: str, text: str) -> float:
    """1 - min(len(summary), len(text)) / (len(text) + 1e-10), lengths in characters."""
    return 1 - min(len(summary), len(text)) / (len(text) + 1e-10)


@dataclass(frozen=True)
class SummaryScoreValue:
    score: float  # not rounded, as in Ragas
    qa: float
    conciseness: float | None  # None when length_penalty is off


def summary_score(
    answers: Sequence[Any], text: str | Sequence[str], summary: str, *, length_penalty: bool = True, coeff: float = 0.5
) -> SummaryScoreValue:
    """Recompute the Ragas-style SummaryScore from saved answers.

    score = QA*(1-coeff) + conciseness*coeff with the length penalty, else QA. An empty or whitespace-only summary
    scores 0 whatever the answers (there are none: it answers nothing) and whatever its conciseness, which the
    formula would make 1: writing nothing is not the best summary (Mastra's scorer gives a summary with no claims 0).
    """
    if not 0 <= coeff <= 1:
        raise ValueError(f"coeff must be between 0 and 1. Given: {coeff}")
    text = join_contexts(text)
    if not text.strip():
        raise ValueError("reference contexts are empty or whitespace-only")
    if not summary.strip():
        return SummaryScoreValue(score=0.0, qa=0.0, conciseness=conciseness(summary, text) if length_penalty else None)
    qa = qa_score(answers)
    if not length_penalty:
        return SummaryScoreValue(score=qa, qa=qa, conciseness=None)
    con = conciseness(summary, text)
    return SummaryScoreValue(score=qa * (1 - coeff) + con * coeff, qa=qa, conciseness=con)
