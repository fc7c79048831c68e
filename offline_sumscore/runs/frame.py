"""pandas: score a DataFrame's rows, one result column per result field."""

from __future__ import annotations

from typing import Any

from offline_sumscore.core.errors import InputError, UsageError
from offline_sumscore.core.results import FailedRow
from offline_sumscore.core.samples import checked_sample
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
    `metric` with **options). A row that cannot be scored gets score None and its error, as in a bulk run."""
    for column in (source, summary) + ((id,) if id else ()):
        if column not in df.columns:
            raise UsageError(f"the DataFrame has no column {column!r}; it has {', '.join(map(str, df.columns))}")
    if scorer is None:
        scorer = METRICS[metric](**options)
    samples, errors = [], {}
    for n, (index, row) in enumerate(df.iterrows()):
        row_id = str(row[id]) if id else str(index)
        try:
            samples.append(
                checked_sample(
                    row_id, row[source], row[summary], source_field=source, summary_field=summary, line=n + 1
                )
            )
        except InputError as exc:
            errors[n] = FailedRow.bad_input(exc, id=row_id, metric=scorer.metric).to_dict()
    results = iter(scorer.score_many(samples, on_error="return"))
    records = []
    for n in range(len(df)):
        record = errors[n] if n in errors else next(results).to_dict()
        record.pop("id", None)
        records.append(record)
    out = df.copy()
    columns = list(dict.fromkeys(k for r in records for k in r))
    for column in columns:
        out[column if column not in df.columns else f"result_{column}"] = [r.get(column) for r in records]
    return out
