"""Percentile intervals over resampled documents: a statistic's spread when the items of one document are not
independent (calibration's intervals; the agreement benchmark's, in benchmarks/lib/agreement_stats.py)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np


def bootstrap_interval(
    fn: Callable[[list[int]], float | None],
    docs: Sequence[Hashable],
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """Percentile interval of fn(indices) over resamples that draw whole documents with replacement. A resample
    where fn is undefined is skipped; None if fewer than half are defined."""
    if resamples <= 0:
        return None
    groups: dict[Hashable, list[int]] = {}
    for i, d in enumerate(docs):
        groups.setdefault(d, []).append(i)
    members = [np.asarray(m) for m in groups.values()]
    if len(members) < 2:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        picks = rng.integers(0, len(members), len(members))
        value = fn(np.concatenate([members[p] for p in picks]))
        if value is not None:
            values.append(value)
    if len(values) < resamples / 2:
        return None
    tail = (1 - level) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))
