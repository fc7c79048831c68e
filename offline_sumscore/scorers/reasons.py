"""The two-axis reason, composed from the verdicts rather than generated: it costs no tokens and cannot contradict
them. It names the axis that set the score and the claims or items behind it."""

from __future__ import annotations

from collections.abc import Sequence

from offline_sumscore.core.figures import figure_note
from offline_sumscore.core.relations import relation_note


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _listed(items: Sequence[str], limit: int = 3, notes: Sequence[str] | None = None) -> str:
    notes = notes or [""] * len(items)
    shown = "; ".join(f'"{s}"{note}' for s, note in zip(items[:limit], notes[:limit]))
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def conflict_note(entry: dict) -> str:
    """(3,870: the source says 1,870 vacant posts) where the figure check found one; else ('27' where the source makes
    the judge expect '17', p 0.98): the words behind a verdict."""
    contradicted = [f for f in entry.get("figures") or [] if f.get("source_says")]
    if contradicted:
        return " (" + "; ".join(figure_note(f) for f in contradicted) + ")"
    if entry.get("relations"):
        return " (" + "; ".join(relation_note(r) for r in entry["relations"]) + ")"
    c = entry.get("conflict")
    if not c:
        return ""
    if not c.get("expected_word"):
        return f" ('{c['word']}' where the source makes the judge expect another word, p {c['p_expected']:.2f})"
    return f" ('{c['word']}' where the source makes the judge expect '{c['expected_word']}', p {c['p_expected']:.2f})"


# The reason of an empty or whitespace-only summary, for both metrics: no verdict was asked, so none is quoted.
EMPTY_SUMMARY_REASON = (
    "The score is 0 because the summary is empty: it states nothing the source could support, and covers nothing "
    "of the source."
)


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
    soft_coverage: bool = False,
) -> str:
    """ "The score is S because ..." naming the axis that set the score and the claims or items behind it."""
    head = f"The score is {_fmt(score)} because"
    if not claims:
        return f"{head} the summary makes no claim that could be checked against the source, so alignment is 0."
    if not questions:
        return f"{head} there was nothing to check coverage against (no {items}), so coverage is 0."
    counted = [(q, v) for q, v in zip(questions, verdicts) if v.get("source_answered", True)]
    unsupported = [c["claim"] for c in claims if not c["supported"]]
    notes = [conflict_note(c) for c in claims if not c["supported"]]
    missed = [q for q, v in counted if not v["answered"]] + questions[len(verdicts) :]
    strict = " (strict mode: an axis below 1 counts as 0)" if strict_mode else ""
    why_a = (
        f"{len(unsupported)} of {len(claims)} claims are not supported by the source: {_listed(unsupported, 3, notes)}"
        if unsupported
        else "every claim is supported by the source"
    )
    why_c = (
        f"the summary does not cover {len(missed)} of {len(counted)} {items}: {_listed(missed)}"
        if missed
        else f"the summary covers every one of the {items}"
    )
    if soft_coverage:  # coverage is the mean P(covered): the items it covers least say why
        least = sorted(counted, key=lambda qv: qv[1].get("p_answered") or 0.0)
        why_c = (
            f"the summary covers the {len(counted)} {items} with a mean probability of {_fmt(round(coverage, 2))}; "
            f"least: {_listed([q for q, _ in least], 2)}"
        )
    if axis == "both":
        if alignment == 1:
            return f"{head} both alignment and coverage are 1: {why_a}, and {why_c}."
        return f"{head} alignment and coverage are both {_fmt(round(alignment, 2))}{strict}: {why_a}; and {why_c}."
    if axis == "alignment":
        return f"{head} alignment ({_fmt(round(alignment, 2))}) set it{strict}: {why_a}."
    return f"{head} coverage ({_fmt(round(coverage, 2))}) set it{strict}: {why_c}."
