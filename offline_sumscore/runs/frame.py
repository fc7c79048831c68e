"""pandas: score a DataFrame's rows, one result column per result field."""

from __future__ import annotations

from typing import Any

from offline_sumscore.core.errors import UsageError
from offline_sumscore.runs.bulk import score_table
from offline_sumscore.scorers import METRICS


def score_frame(
    df,
    *,
    source: str = "source",
    summary: str = "summary",
    id: str | None = None,
    scorer: Any = None,
    metric: str = "two-axis",
    **options,
):
    """df with one result column per result field added (score, reason, alignment, ..., error), in df's order.

    source/summary/id name df's columns. scorer: a SummarizationScorer or SummaryScore (else one is made for
    `metric` with **options). A row that cannot be scored gets score None and its error, as in a bulk run; the
    `error` column is there when every row scored too (all None), so code that reads it never meets a KeyError."""
    for column in (source, summary) + ((id,) if id else ()):
        if column not in df.columns:
            raise UsageError(f"the DataFrame has no column {column!r}; it has {', '.join(map(str, df.columns))}")
    if scorer is None:
        scorer = METRICS[metric](**options)
    rows = [row for _, row in df.iterrows()]
    records = score_table(
        scorer,
        [str(row[id]) if id else str(index) for index, row in zip(df.index, rows)],
        [row[source] for row in rows],
        [row[summary] for row in rows],
        source_field=source,
        summary_field=summary,
        numbered=True,
    )
    for record in records:
        record.pop("id", None)
    out = df.copy()
    columns = list(dict.fromkeys([*(k for r in records for k in r), "error"]))
    for column in columns:
        out[column if column not in df.columns else f"result_{column}"] = [r.get(column) for r in records]
    return out
