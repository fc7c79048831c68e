"""`sumscore calibrate`: the likelihood threshold that fits the user's text, from a few rows labelled consistent or
not, scored by the judge at its likelihood design (analysis/calibration.py holds the arithmetic)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offline_sumscore.analysis.calibration import Calibration, calibrate
from offline_sumscore.core.errors import InputError, UsageError
from offline_sumscore.core.results import FailedRow
from offline_sumscore.core.samples import BadRow
from offline_sumscore.io.inputs import read_field, read_rows
from offline_sumscore.scorers import SummarizationScorer

LABELS = {"consistent": True, "inconsistent": False, "true": True, "false": False, "yes": True, "no": False}
LABELS.update({"1": True, "0": False})


@dataclass
class CalibrationRun:
    calibration: Calibration
    judge: dict  # the judge the threshold belongs to (name, identity)
    failed: int  # rows the judge could not score (left out)
    likelihood_rule: str | None = None  # the rule the rows were judged under (design.likelihood_rule)

    def to_dict(self) -> dict:
        return {
            "likelihood_threshold": self.calibration.threshold,
            "judge": self.judge,
            "likelihood_rule": self.likelihood_rule,
            "calibration": self.calibration.to_dict(),
            "failed_rows": self.failed,
        }


def label_of(value: Any, line: int, field: str, path: str) -> bool:
    """A row's label as a bool: consistent/inconsistent, true/false, yes/no, 1/0 (any case), or a JSON boolean."""
    key = str(value).strip().lower()
    if key not in LABELS:
        raise InputError(
            f"is {'missing' if value is None else repr(value)}; a label is consistent or inconsistent (or true/false, "
            "yes/no, 1/0)",
            field=field,
            line=line,
            path=path,
            cause="bad_label",
        )
    return LABELS[key]


def calibrate_file(
    input_path: str | os.PathLike,
    *,
    model: Any = None,
    options: dict | None = None,
    label_field: str = "label",
    fields: dict | None = None,
    resamples: int = 2000,
    seed: int = 0,
    progress: bool = False,
    notify: Callable[[str], None] | None = None,
) -> CalibrationRun:
    """Score every labelled row with likelihood verdicts on each summary sentence, take each row's lowest claim
    PMI, and pick the threshold that separates the consistent rows best (a summary is consistent when all its
    claims are). A bad row or label fails the whole calibration loudly: a threshold is only as good as its rows.
    fields: which field is what (source_field, summary_field, id_field), as read_rows takes them."""
    if options and "likelihood_threshold" in options:
        raise UsageError("calibrate chooses --likelihood-threshold; do not give it")
    rows = list(read_rows(input_path, **(fields or {})))
    for row in rows:
        if isinstance(row, BadRow):
            raise row.error
    found = read_field(input_path, label_field)
    labels = [label_of(found.get(r.line), r.line, label_field, str(input_path)) for r in rows]
    # Only the claims' verdicts are read; coverage is asked of one key sentence, the least it can be.
    design = dict(claims="sentences", verdicts="likelihood", coverage="key_sentences", key_sentences=1)
    scorer = SummarizationScorer(model, **design, **(options or {}))
    scorer.notify = notify
    results = scorer.score_many(rows, on_error="return", progress=progress)
    kept = [(r, y) for r, y in zip(results, labels) if not isinstance(r, FailedRow) and r.claims]
    if not kept:
        raise InputError("has no row the judge could score", path=str(Path(input_path)), cause="no_rows")
    # What the verdict compares with the threshold: the claim's score (its mean PMI, less half its worst fact
    # conflict's, where it has one).
    values = [min(c.get("verdict_score", c["pmi"]) for c in r.claims) for r, _ in kept]
    calibration = calibrate(values, [y for _, y in kept], resamples=resamples, seed=seed)
    judge = {k: kept[0][0].judge.get(k) for k in ("name", "identity", "dtype")}
    rule = kept[0][0].settings.get("design.likelihood_rule")
    return CalibrationRun(calibration, judge, failed=len(rows) - len(kept), likelihood_rule=rule)
