"""What a run's rows say about the run as a whole, in one line each, for the CLI and the report: scores that are
nearly all one value (and which axis set them), and texts the embedded judge was not made for. Pure functions over
OUTPUT rows: no model.

A run whose scores are all 0.000 compares nothing, and nothing else in it says why: the line names the value, the
share, the axis that set it in most of those rows, and where that axis comes from for this judge. The embedded judge
was made on English text; on another language its verdicts mean less still, and the line says so once a run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

ALIKE_SHARE = 0.75  # a run with at least this share of its scores on one value says so
ALIKE_MIN_ROWS = 3
ENGLISH_SHARE = 0.08  # a text whose words are less often than this one of English's commonest looks like another
ENGLISH_MIN_WORDS = 8  # shorter texts say too little to tell

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
# English's commonest function words, none of them a common word of Spanish, French, German, Italian or Portuguese
# ("a", "in", "die", "con" left out): in English prose they are a quarter to a third of the words.
_ENGLISH = frozenset(
    """
the of and to is was that for it with as by at from this which be are were has have had been not but they their
there we you he she his her its would will can could than when who what also after about into more other some such
only over new most these those them said
""".split()
)

# Where each axis of a two-axis score comes from, as a row records it (coverage_from), in a few words.
_COVERAGE_FROM = {
    "key_sentences": "the share of the source's key sentences (its first few) the summary makes the judge expect",
    "questions": "the share of the questions drawn from the source that the summary answers yes",
    "user_questions": "the share of your questions that the summary answers yes",
    "key_facts": "the share of your key facts the summary states",
}


def english_share(text: str) -> float | None:
    """The share of a text's words that are among English's commonest function words; None for a text too short
    to tell (fewer than ENGLISH_MIN_WORDS words)."""
    words = [w.lower() for w in _WORD.findall(text or "")]
    if len(words) < ENGLISH_MIN_WORDS:
        return None
    return sum(w in _ENGLISH for w in words) / len(words)


def looks_english(text: str) -> bool:
    share = english_share(text)
    return share is None or share >= ENGLISH_SHARE


def judged_text(row: dict) -> str:
    """The text a row's verdicts were given on, as OUTPUT keeps it: its claims (the summary's) and its coverage items
    (the source's key sentences, or questions drawn from it)."""
    claims = [c.get("claim", "") if isinstance(c, dict) else str(c) for c in row.get("claims") or []]
    return " ".join(claims + [str(q) for q in row.get("questions") or []])


def alike_scores(rows: Iterable[dict]) -> str | None:
    """One line where most of a run's scores (ALIKE_SHARE of its scored rows, at least ALIKE_MIN_ROWS) are the same
    value: the value, the share, the axis that set it in most of those rows and what that axis measures for this
    run; None otherwise."""
    scored = [r for r in rows if r.get("score") is not None and not r.get("error")]
    if len(scored) < ALIKE_MIN_ROWS:
        return None
    value, count = Counter(round(float(r["score"]), 3) for r in scored).most_common(1)[0]
    if count / len(scored) < ALIKE_SHARE:
        return None
    alike = [r for r in scored if round(float(r["score"]), 3) == value]
    line = f"{count} of {len(scored)} scores are {value:.3f}"
    axis, set_by = Counter(r.get("limiting_axis") for r in alike).most_common(1)[0]
    if axis in ("alignment", "coverage"):
        line += f", set by {axis} in {set_by} of them"
        source = Counter(r.get("coverage_from") for r in alike).most_common(1)[0][0]
        if axis == "coverage" and source in _COVERAGE_FROM:
            line += f" (coverage here is {_COVERAGE_FROM[source]})"
        elif axis == "alignment":
            line += " (alignment is the share of the summary's claims the judge finds supported)"
    elif alike and "qa" in alike[0]:
        line += " (summary-score: QA against conciseness, weighted by coeff)"
    return line + ": the scores say little about how these summaries differ; see the rows' verdicts"


def not_english(rows: Iterable[dict]) -> str | None:
    """One line where rows scored by the embedded judge hold text that does not look English: how many, and the
    first; None otherwise."""
    from offline_sumscore.core.results import scored_by_embedded

    found = [r for r in rows if scored_by_embedded(r) and not looks_english(judged_text(r))]
    if not found:
        return None
    first = found[0].get("id") or f"line {found[0].get('line')}"
    return (
        f"{len(found)} row(s) hold text that does not look like English (the first: {first}): the embedded judge was "
        "made for English, and its verdicts on another language mean less still; bring a multilingual judge (--model)"
    )


def run_notes(rows: Iterable[dict]) -> list[str]:
    """Every line above that applies to this run (rows is read once per note: a long run's rows come from its file)."""
    return [note for note in (alike_scores(rows), not_english(rows)) if note]
