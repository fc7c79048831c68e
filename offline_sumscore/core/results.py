"""Result records: what score() returns and what each OUTPUT row holds (to_dict), and what rescoring reads.

Every verdict is kept, with each stage's prompt, raw output, token counts and seconds, so a score can be
audited and recomputed without the model (see arithmetic.two_axis_score / summary_score).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from offline_sumscore.core.errors import InputError, JudgeOutputError


@dataclass
class SummarizationResult:
    """Two-axis result. alignment and coverage are unrounded; score is rounded half up after scaling."""

    id: str
    score: float
    reason: str | None
    alignment: float
    coverage: float
    limiting_axis: str
    passed: bool
    claims: list[dict]  # {"claim", "supported", "p_supported", "reason"?, "pmi"?, "piece"?, "p_by_piece"?}
    questions: list[str]  # the coverage items: questions, key facts or key sentences (see coverage_from)
    coverage_from: str  # "questions" (drawn by the judge), "user_questions", "key_facts" or "key_sentences"
    coverage_verdicts: list[dict]  # {"answered", "p_answered", "reason"?, "pmi"?, "source_answered"?}, by position
    dropped_questions: list[dict] = field(default_factory=list)  # {"question", "why"}: drawn, but not counted
    # Figures of the summary that no claim states and the source states nowhere, named only (figure_check's entries
    # with the summary sentence); one the source states otherwise is a claim instead (two_axis_stages)
    unclaimed_figures: list[dict] = field(default_factory=list)
    soft_alignment: float | None = None  # mean P(supported) over claims, read from the judge's distribution
    soft_coverage: float | None = None  # mean P(answered) over the counted coverage items
    source_pieces: int = 1  # >1: the source was too long for the judge's context and was judged in this many pieces
    # True: the summary was empty or whitespace-only, and scored 0 without asking the judge (samples.is_empty_summary)
    empty_summary: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict] = field(default_factory=dict)  # stage -> prompt, raw_output, tokens, seconds
    judge: dict[str, Any] = field(default_factory=dict)
    metric: str = "two-axis"

    @property
    def success(self) -> bool:  # DeepEval's name for passed
        return self.passed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SummaryScoreResult:
    """Ragas-style result: score = QA*(1-coeff) + conciseness*coeff (or QA alone), not rounded."""

    id: str
    score: float
    qa: float
    conciseness: float | None
    keyphrases: list[str]
    questions: list[str]
    answers: list[str]  # "1" / "0", one per question, in order
    answer_p_yes: list[float | None] = field(default_factory=list)  # P("1") per answer, from the distribution
    soft_qa: float | None = None  # mean P("1") over answers
    source_pieces: int = 1  # >1: the text was too long for the judge's context; keyphrases and questions per piece
    # Ragas gives no reason; a row whose score no answer explains says why here (an empty summary), else None
    reason: str | None = None
    empty_summary: bool = False  # as SummarizationResult's: scored 0 without asking the judge
    settings: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict] = field(default_factory=dict)
    judge: dict[str, Any] = field(default_factory=dict)
    metric: str = "summary-score"

    @property
    def value(self) -> float:  # Ragas's MetricResult name
        return self.score

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FailedRow:
    """A row that could not be scored: never a score. error holds the stage, the message and the raw output."""

    id: str
    error: dict[str, Any]
    metric: str
    stages: dict[str, dict] = field(default_factory=dict)
    exception: Any = field(default=None, repr=False, compare=False)  # the error itself, for on_error="raise"

    @classmethod
    def judge_failed(cls, exc: JudgeOutputError, *, id: str, metric: str) -> FailedRow:
        """The row of a sample whose judge stage failed: the stage, its cause, the message, the raw output, and the
        audit of every stage run up to it."""
        return cls(
            id=id,
            metric=metric,
            stages=exc.stages,
            exception=exc,
            error={
                "stage": exc.stage,
                "cause": f"{exc.stage}:{exc.kind}",
                "message": str(exc),
                "raw_output": exc.raw_output,
            },
        )

    @classmethod
    def bad_input(cls, exc: InputError, *, id: Any, metric: str) -> FailedRow:
        """The row of an input row that cannot be scored (it never reached the judge): the field and the rule."""
        return cls(
            id=id,
            metric=metric,
            exception=exc,
            error={"stage": "input", "cause": f"input:{exc.cause}", "field": exc.field, "message": str(exc)},
        )

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "metric": self.metric, "score": None, "stages": self.stages, "error": self.error}


# -- what a person reads of OUTPUT rows (the CLI's summary lines and the HTML report share these) ------------------
SHORT_FIELD = 24  # an input field this short names a row (doc, model); longer ones are its texts


def row_label(row: dict[str, Any]) -> str:
    """A row as a person finds it again: its id, else its line in INPUT, with the input's short fields beside it
    ("line 5 (doc d2, model B)")."""
    name = f"line {row.get('line')}" if row.get("id") in (None, "") else str(row["id"])
    short = [
        f"{key} {value}"
        for key, value in (row.get("input") or {}).items()
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and len(str(value)) <= SHORT_FIELD
        if str(value) != name
    ]
    return name + (f" ({', '.join(short)})" if short else "")


EMBEDDED_JUDGE_NOTE = (
    "scored by the embedded judge, SmolLM2-135M-Instruct: it shows the pipeline runs, offline, not what a summary "
    "is worth; its verdicts mostly measure how much of a sentence the source lets it copy, and they are no "
    "substitute for a real judge's. For real judging bring a 7-8B instruct model: --model DIR (a Hugging Face "
    "model directory or a .gguf file; `sumscore models` lists presets)."
)


def scored_by_embedded(row: dict[str, Any]) -> bool:
    """Whether the embedded judge scored this row (what EMBEDDED_JUDGE_NOTE is said for)."""
    return bool((row.get("judge") or {}).get("embedded"))


def embedded_judge_note(rows: list[dict[str, Any]]) -> str | None:
    """EMBEDDED_JUDGE_NOTE where any row was scored by the embedded judge; None otherwise."""
    return EMBEDDED_JUDGE_NOTE if any(scored_by_embedded(r) for r in rows) else None


def first_clause(reason: str | None, limit: int = 110) -> str:
    """A reason's first clause ("The score is 0 because alignment (0) set it"), within limit characters."""
    head = (reason or "").split(": ", 1)[0].rstrip(".")
    return head if len(head) <= limit else head[: limit - 1] + "…"
