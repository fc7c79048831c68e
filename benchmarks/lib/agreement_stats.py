"""Agreement statistics: how closely one set of scores tracks another (a judge against humans, or two judges), for
the agreement and calibration benchmarks and the research scripts (the package itself needs none of them).

Pure functions on numbers; no model. Correlations handle ties (average ranks; Kendall's tau-b). Each returns
None where it is undefined (fewer than two items, or a constant side), never NaN.

- dataset level: one correlation over all items;
- summary level (as G-Eval reports): the correlation within each document across its summaries, averaged over
  the documents where it is defined;
- bootstrap 95% intervals resample whole documents (items of one document are not independent; the
  package's analysis.bootstrap, which calibration shares);
- binary labels: balanced accuracy (the mean of the per-class recalls) and Cohen's kappa for hard verdicts; the
  area under the ROC curve for soft ones (P(yes)), where 0.5 is chance, as balanced accuracy's 0.5 is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from offline_sumscore.analysis.bootstrap import bootstrap_interval

Stat = Callable[[Sequence[float], Sequence[float]], "float | None"]


def _pairs(x: Sequence[float | None], y: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """Drop the items where either side is missing."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} and {len(y)}")
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype.kind == "f" and y.dtype.kind == "f":
        keep_mask = ~(np.isnan(x) | np.isnan(y))
        return x[keep_mask], y[keep_mask]
    keep = [
        (a, b)
        for a, b in zip(x, y)
        if a is not None
        and b is not None
        and not (isinstance(a, float) and math.isnan(a))
        and not (isinstance(b, float) and math.isnan(b))
    ]
    if not keep:
        return np.zeros(0), np.zeros(0)
    arr = np.asarray(keep, dtype=float)
    return arr[:, 0], arr[:, 1]


def rank(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given their average rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    sorted_v = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(x, y) -> float | None:
    a, b = _pairs(x, y)
    if len(a) < 2:
        return None
    a, b = a - a.mean(), b - b.mean()
    denom = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else None


def spearman(x, y) -> float | None:
    a, b = _pairs(x, y)
    return pearson(rank(a), rank(b)) if len(a) >= 2 else None


def kendall_tau_b(x, y) -> float | None:
    """(concordant - discordant) / sqrt((n0 - ties in x) (n0 - ties in y)), n0 = n(n-1)/2."""
    a, b = _pairs(x, y)
    if len(a) < 2:
        return None
    sa = np.sign(a[:, None] - a[None, :])
    sb = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    s = float((sa[upper] * sb[upper]).sum())
    untied_a = float((sa[upper] != 0).sum())
    untied_b = float((sb[upper] != 0).sum())
    return s / math.sqrt(untied_a * untied_b) if untied_a and untied_b else None


CORRELATIONS: dict[str, Stat] = {"spearman": spearman, "kendall": kendall_tau_b, "pearson": pearson}


def per_document(stat: Stat, x, y, docs: Sequence[Hashable]) -> dict[Hashable, float]:
    """The statistic within each document (its summaries only), where it is defined."""
    groups: dict[Hashable, list[int]] = {}
    for i, d in enumerate(docs):
        groups.setdefault(d, []).append(i)
    out = {}
    for d, idx in groups.items():
        value = stat([x[i] for i in idx], [y[i] for i in idx])
        if value is not None:
            out[d] = value
    return out


def summary_level(stat: Stat, x, y, docs) -> float | None:
    """The mean over documents of the within-document statistic (G-Eval's summary-level correlation)."""
    values = list(per_document(stat, x, y, docs).values())
    return float(np.mean(values)) if values else None


def correlate(x, y, docs, *, resamples: int = 1000, seed: int = 0) -> dict:
    """Every correlation at both levels, each with its bootstrap interval over documents.

    Returns {"n": items used, "documents": n, "dataset": {name: {"value", "ci"}}, "summary": {...}}."""
    used = [i for i in range(len(x)) if x[i] is not None and y[i] is not None]
    a = np.asarray([float(x[i]) for i in used])
    b = np.asarray([float(y[i]) for i in used])
    d = [docs[i] for i in used]
    out: dict = {"n": len(used), "documents": len(set(d)), "dataset": {}, "summary": {}}
    for name, stat in CORRELATIONS.items():
        out["dataset"][name] = {
            "value": stat(a, b),
            "ci": bootstrap_interval(lambda idx, stat=stat: stat(a[idx], b[idx]), d, resamples=resamples, seed=seed),
        }
        within = list(per_document(stat, a, b, d).values())  # resampled: a document drawn twice counts twice
        out["summary"][name] = {
            "value": float(np.mean(within)) if within else None,
            "documents_defined": len(within),
            "ci": bootstrap_interval(
                lambda idx, within=within: float(np.mean(np.asarray(within)[idx])),
                list(range(len(within))),
                resamples=resamples,
                seed=seed,
            ),
        }
    return out


def balanced_accuracy(truth: Sequence[bool], predicted: Sequence[bool]) -> float | None:
    """The mean, over the classes present in truth, of the share of that class predicted right."""
    pairs = [(bool(t), bool(p)) for t, p in zip(truth, predicted) if t is not None and p is not None]
    recalls = []
    for cls in (True, False):
        members = [p for t, p in pairs if t == cls]
        if members:
            recalls.append(sum(p == cls for p in members) / len(members))
    return float(np.mean(recalls)) if recalls else None


def cohens_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """(observed agreement - chance agreement) / (1 - chance agreement); None when chance agreement is 1."""
    pairs = [(bool(x), bool(y)) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return None
    n = len(pairs)
    observed = sum(x == y for x, y in pairs) / n
    pa, pb = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return (observed - chance) / (1 - chance) if chance < 1 else None


def binary_agreement(truth, predicted) -> dict:
    pairs = [(t, p) for t, p in zip(truth, predicted) if t is not None and p is not None]
    return {
        "n": len(pairs),
        "balanced_accuracy": balanced_accuracy(*zip(*pairs)) if pairs else None,
        "kappa": cohens_kappa(*zip(*pairs)) if pairs else None,
        "positives_truth": sum(bool(t) for t, _ in pairs),
        "positives_predicted": sum(bool(p) for _, p in pairs),
    }


def roc_auc(truth: Sequence[bool], scores: Sequence[float]) -> float | None:
    """The chance that a random positive scores above a random negative (ties count half): Mann-Whitney U over
    n_pos * n_neg, from average ranks. None without both classes."""
    pairs = [(bool(t), float(p)) for t, p in zip(truth, scores) if t is not None and p is not None]
    pos = sum(t for t, _ in pairs)
    neg = len(pairs) - pos
    if not pos or not neg:
        return None
    ranks = rank([p for _, p in pairs])
    rank_sum = sum(r for r, (t, _) in zip(ranks, pairs) if t)
    return float((rank_sum - pos * (pos + 1) / 2) / (pos * neg))


def with_interval(
    stat: Callable[[list, list], float | None],
    truth: Sequence,
    scores: Sequence,
    docs: Sequence[Hashable],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """{"value", "ci"} of a statistic of (truth, scores) pairs, such as roc_auc or balanced_accuracy, with a bootstrap
    interval that resamples whole documents. Pairs where either side is None are left out."""
    keep = [i for i in range(len(truth)) if truth[i] is not None and scores[i] is not None]
    t, s, d = [truth[i] for i in keep], [scores[i] for i in keep], [docs[i] for i in keep]
    value = stat(t, s) if keep else None
    ci = (
        bootstrap_interval(
            lambda idx: stat([t[i] for i in idx], [s[i] for i in idx]), d, resamples=resamples, seed=seed
        )
        if keep
        else None
    )
    return {"value": value, "ci": list(ci) if ci else None, "n": len(keep)}
