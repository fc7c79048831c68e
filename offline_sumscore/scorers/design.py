"""How the two-axis stages ask a judge by default: the scorers' choice, made from what the engine says of its judge.

The embedded 135M judge cannot write claims or questions worth checking, nor follow a Yes/No instruction reliably;
measured: FRANK sentence AUC 0.62 for its best Yes/No prompt against 0.94 for likelihood verdicts, REALSumm key-fact
AUC 0.38 (inverted) against 0.71. A judge a user brings gets the design the hosted-judge metrics use: atomic claims,
questions drawn from the source, Yes/No verdicts with reasons. "auto" in the scorer resolves to these, and every
row records the choice.
"""

from __future__ import annotations

EMBEDDED_STAGES = {"claims": "sentences", "coverage": "key_sentences", "verdicts": "likelihood", "prompt_style": "bare"}
BROUGHT_STAGES = {"claims": "atomic", "coverage": "questions", "verdicts": "yes-no", "prompt_style": "full"}


def stage_defaults(judge: dict) -> dict[str, str]:
    """The default design for the judge an engine describes (Engine.describe()["judge"])."""
    return dict(EMBEDDED_STAGES if judge.get("embedded") else BROUGHT_STAGES)


# The embedded design's coverage: the mean P(covered) over the key sentences, not the share of verdicts past the
# threshold. Measured on SummEval dev (10 documents, 120 summaries) and on ordinary 1-3 sentence summaries
# (research/coverage_rule.py, results/coverage_rule.md): scores of 0 fell from 26% to 2% and from 62% to 12%, and
# Spearman with the experts' relevance rose from 0.15 to 0.24 (read, not tuned for); fewer key sentences for a short
# summary did neither.
SOFT_COVERAGE = "mean P(covered) over the key sentences"


# What rows record of two rules every design runs by (settings.design), so rows scored before them can be told apart:
# a figure the claims stage dropped is still checked (two_axis_stages.figures_beyond_claims) and named against the
# source's figure of its measure and thing (core.figures.figure_place: "220 °C" never against "40 minutes"; "no
# one" counts nobody), and drawn questions are closed by their grammar (scorers/stages/questions.CLOSED_QUESTION).
FIGURE_RULE = (
    "every figure of the summary checked against the source, whether or not a claim kept it; named against the "
    "source's figure of the same measure and for the same thing"
)
# Roles and quantity words checked from the texts on every judged claim (two_axis_stages.relations_checked).
RELATION_RULE = (
    "a claim binding a name to what the source binds to another name, or saying all or most of what the source "
    "gives as a share, is unsupported"
)
CLOSED_QUESTION_RULE = "drawn questions closed by the grammar: an auxiliary verb first, one question mark last"


def rules_recorded(design: dict) -> dict[str, str]:
    """The rules above that apply to a design: the figure and relation rules always, the question rule where questions
    are drawn."""
    return {"figure_rule": FIGURE_RULE, "relation_rule": RELATION_RULE} | (
        {"question_rule": CLOSED_QUESTION_RULE} if design["coverage"] == "questions" else {}
    )
