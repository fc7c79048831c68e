"""A likelihood threshold that fits the user's own text, from a few labelled rows, and the check that a run's
verdicts are not all on one side. Pure functions over numbers: no model.

A summary is consistent when every claim is supported, and a claim is supported when its verdict score (its PMI in
nats per token, less half its worst fact conflict's) is at least the threshold; so a row's value is its lowest claim
score, and the threshold that separates a labelled set's
consistent rows from the others best (balanced accuracy) is the one to use on that kind of text. The 2.0-nat default
was set on FRANK's news sentences; a faithful paraphrase of a conversation sits below it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from offline_sumscore.analysis.bootstrap import bootstrap_interval

ONE_SIDED = 0.95  # a run with at least this share of its claims on one side says so


@dataclass(frozen=True)
class Calibration:
    threshold: float  # nats per token: --likelihood-threshold
    balanced_accuracy: float  # of (value >= threshold) against the labels, on the rows it was chosen on
    threshold_interval: list[float] | None  # 95% bootstrap interval of the chosen threshold (rows resampled)
    balanced_accuracy_interval: list[float] | None
    rows: int
    consistent: int

    def to_dict(self) -> dict:
        return asdict(self)


def best_threshold(values: Sequence[float], labels: Sequence[bool]) -> tuple[float, float] | None:
    """The threshold t for which (value >= t) agrees best with labels (balanced accuracy), and that accuracy; None
    without both classes. Candidates lie midway between neighbouring values; of equally good ones, the middle one."""
    v, y = np.asarray(values, dtype=float), np.asarray(labels, dtype=bool)
    if y.all() or not y.any():
        return None
    ordered = np.unique(v)
    candidates = np.concatenate(([ordered[0] - 1.0], (ordered[1:] + ordered[:-1]) / 2, [ordered[-1] + 1.0]))
    positives, negatives = np.sort(v[y]), np.sort(v[~y])
    recall = (len(positives) - np.searchsorted(positives, candidates)) / len(positives)  # consistent, at or above
    specificity = np.searchsorted(negatives, candidates) / len(negatives)  # inconsistent, below
    scores = (recall + specificity) / 2
    tied = candidates[scores == scores.max()]
    return float(tied[len(tied) // 2]), float(scores.max())


def calibrate(values: Sequence[float], labels: Sequence[bool], *, resamples: int = 2000, seed: int = 0) -> Calibration:
    """The best threshold on these rows, with bootstrap intervals (rows resampled) for it and its accuracy."""
    found = best_threshold(values, labels)
    if found is None:
        raise ValueError("calibration needs labelled rows of both kinds, consistent and not")
    threshold, accuracy = found

    v, y = np.asarray(values, dtype=float), np.asarray(labels, dtype=bool)

    def resampled(i: int):
        def fn(idx):
            again = best_threshold(v[idx], y[idx])
            return again[i] if again else None

        return bootstrap_interval(fn, list(range(len(values))), resamples=resamples, seed=seed)

    t_ci, ba_ci = resampled(0), resampled(1)
    return Calibration(
        threshold=round(threshold, 4),
        balanced_accuracy=accuracy,
        threshold_interval=[round(x, 4) for x in t_ci] if t_ci else None,
        balanced_accuracy_interval=list(ba_ci) if ba_ci else None,
        rows=len(values),
        consistent=sum(bool(x) for x in labels),
    )


def one_sided(verdicts: Sequence[bool]) -> str | None:
    """A sentence saying that a run's verdicts are degenerate (ONE_SIDED or more on one side), else None."""
    if len(verdicts) < 20:
        return None
    share = sum(bool(v) for v in verdicts) / len(verdicts)
    if min(share, 1 - share) > 1 - ONE_SIDED:
        return None
    side = "supported" if share >= 0.5 else "unsupported"
    return (
        f"{max(share, 1 - share):.0%} of {len(verdicts)} claims are {side}: the likelihood threshold does not fit this "
        "text; run `sumscore calibrate` on a few rows labelled consistent or not, and score with its --calibration"
    )


def is_likelihood_row(row: dict) -> bool:
    """A scored OUTPUT row whose verdicts were read by likelihood (the design the threshold belongs to)."""
    return not row.get("error") and (row.get("settings") or {}).get("design.verdicts") == "likelihood"


def one_sided_run(rows: Iterable[dict]) -> str | None:
    """one_sided over the claims of a run's likelihood rows (read once, one row at a time: a run's rows may be read
    from its file)."""
    return one_sided([c.get("supported") for r in rows if is_likelihood_row(r) for c in r.get("claims") or []])
