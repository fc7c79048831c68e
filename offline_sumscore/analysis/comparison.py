"""Which summarizer is better, and how sure: paired comparisons of systems scored on the same documents.

Rows of two or more `sumscore score` OUTPUTs (one per system), or of one OUTPUT whose rows name their system in a
field (`--system-field model`), are paired by document: a named field (`--document-field doc`), else the source
text's hash that every row carries. A field is looked up among the row's own fields, then among its input's. Only
documents that every compared system scored count; failed rows are counted and left out (a failed row is never a
zero). For each pair of systems and each score field: the mean difference, a paired bootstrap 95% interval that
resamples documents, a sign-flip permutation test (exact up to 16 documents), and win / tie / loss counts. With more
than two systems, each system's mean with its bootstrap interval and the pairwise p-values adjusted by Holm's step-
down method.

Pure functions over rows: no model, no files (the CLI reads and writes).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.core.errors import InputError

FIELDS = {
    "two-axis": ("score", "alignment", "coverage", "soft_alignment", "soft_coverage"),
    "summary-score": ("score", "qa", "conciseness", "soft_qa"),
}
ALPHA = 0.05
TIE = 1e-9  # differences within this are ties (scores are exact fractions, rounded)
EXACT_UP_TO = 16  # documents: up to here the permutation test enumerates every sign pattern


@dataclass
class System:
    """One system's rows, keyed by document."""

    name: str
    rows: dict[str, dict]  # document key -> row (scored)
    failed: list[str] = field(default_factory=list)  # ids of failed rows, left out
    unkeyed: list[str] = field(default_factory=list)  # ids of rows with no document key
    duplicates: list[str] = field(default_factory=list)  # ids of rows whose document was already scored
    metric: str = ""
    signature: dict = field(default_factory=dict)
    id_field: str | None = None  # the field that names a row in what is reported (row_name)


def field_value(row: dict, name: str) -> Any:
    """A row's field: one of ours (id, doc_id, ...), else one of the input row's own (row["input"]: doc, model, ...)."""
    if row.get(name) is not None:
        return row[name]
    return (row.get("input") or {}).get(name)


def document_key(row: dict, by: str | None) -> str | None:
    """The document a row scores: the named field, else the hash of its source (`source_hash`)."""
    if by:
        value = field_value(row, by)
        return None if value is None or value == "" else str(value)
    return row.get("source_hash")


def row_name(row: dict, id_field: str | None = None) -> str:
    """What a row is called in a comparison: the named id field, else its id, else its line in INPUT."""
    value = field_value(row, id_field) if id_field else row.get("id")
    return str(value) if value not in (None, "") else f"line {row.get('line')}"


def split_by_system(rows: list[dict], system_field: str) -> dict[str, list[dict]]:
    """One OUTPUT's rows as systems, by the field that names each row's system (in the order systems first appear).
    A row without it is an error naming the row: it belongs to no system."""
    systems: dict[str, list[dict]] = {}
    for row in rows:
        value = field_value(row, system_field)
        if value in (None, ""):
            raise InputError(
                f"row {row_name(row)} has no {system_field!r} field (nor in its input's fields: "
                f"{', '.join(map(str, row.get('input') or {})) or 'none'}): it names no system",
                cause="no_system",
            )
        systems.setdefault(str(value), []).append(row)
    return systems


def signature(row: dict) -> dict:
    """What a score depends on besides the summary: the metric, the judge (name, weights' identity, precision) and
    every scorer setting (prompt version included). Rows compare only under equal signatures."""
    judge = row.get("judge") or {}
    return {
        "metric": row.get("metric"),
        "judge": judge.get("name"),
        "judge_identity": judge.get("identity"),
        "dtype": judge.get("dtype"),
        # "run." keys say what a run found (its verdicts all on one side), not how it scored: not compared.
        **{f"settings.{k}": v for k, v in sorted((row.get("settings") or {}).items()) if not k.startswith("run.")},
    }


def _numbers(row: dict) -> dict:
    """CSV gives every field as text: the score fields as numbers again ("" is no value)."""
    names = {f for fields in FIELDS.values() for f in fields}
    fixed = dict(row)
    for name in names & set(row):
        value = row[name]
        if isinstance(value, str):
            try:
                fixed[name] = float(value) if value.strip() else None
            except ValueError:
                pass
    return fixed


def system_from_rows(name: str, rows: list[dict], by: str | None = None, id_field: str | None = None) -> System:
    system = System(name=name, rows={}, id_field=id_field)
    for row in map(_numbers, rows):
        rid = row_name(row, id_field)
        if row.get("score") is None or row.get("error"):
            system.failed.append(rid)
            continue
        key = document_key(row, by)
        if key is None:
            system.unkeyed.append(rid)
            continue
        if key in system.rows:
            system.duplicates.append(rid)
            continue
        system.rows[key] = row
        if not system.metric:
            system.metric, system.signature = row.get("metric") or "", signature(row)
    return system


def differences(systems: list[System]) -> dict[str, list]:
    """Signature fields on which the systems' rows differ: field -> one value per system ([] when all agree).
    Rows within one system must agree too: a system whose own rows differ is named with its first differing row."""
    problems: dict[str, list] = {}
    for s in systems:
        for row in s.rows.values():
            mine = signature(row)
            if mine != s.signature:
                key = next(k for k in sorted(set(mine) | set(s.signature)) if mine.get(k) != s.signature.get(k))
                raise InputError(
                    f"mixes settings within one system: row {row.get('id')} has {key}="
                    f"{mine.get(key)!r}, earlier rows {s.signature.get(key)!r}",
                    path=s.name,
                    cause="mixed_settings",
                )
    keys = sorted(set().union(*(s.signature for s in systems)))
    for key in keys:
        values = [s.signature.get(key) for s in systems]
        if any(v != values[0] for v in values[1:]):
            problems[key] = values
    return problems


def common_documents(systems: list[System]) -> list[str]:
    keys = set(systems[0].rows)
    for s in systems[1:]:
        keys &= set(s.rows)
    return sorted(keys)


# -- statistics ---------------------------------------------------------------------------------------------------
def bootstrap_interval(
    diffs: list[float], *, resamples: int = 10000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the mean difference, resampling documents with replacement (seeded: reproducible)."""
    import numpy as np

    n = len(diffs)
    if n == 0:
        return math.nan, math.nan
    values = np.asarray(diffs, dtype=np.float64)
    means = values[np.random.default_rng(seed).integers(0, n, size=(resamples, n))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def permutation_p(diffs: list[float], *, resamples: int = 10000, seed: int = 0) -> float:
    """Two-sided paired permutation test of mean difference 0: each document's difference keeps its size and takes
    either sign. Exact (every sign pattern) up to EXACT_UP_TO documents, else `resamples` random patterns with the
    +1 correction."""
    import numpy as np

    n = len(diffs)
    if n == 0:
        return math.nan
    values = np.asarray(diffs, dtype=np.float64)
    observed = abs(values.sum()) - 1e-12
    if n <= EXACT_UP_TO:
        patterns = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        sums = np.abs(((1 - 2 * patterns) * values).sum(axis=1))
        return float((sums >= observed).sum() / 2**n)
    signs = 1 - 2 * np.random.default_rng(seed).integers(0, 2, size=(resamples, n))
    hits = int((np.abs((signs * values).sum(axis=1)) >= observed).sum())
    return (hits + 1) / (resamples + 1)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest p times (m - i), kept monotone, capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def verdict(mean_diff: float, p: float, alpha: float = ALPHA) -> str:
    """ "A" (the first system better), "B", or "no difference" at level alpha."""
    if p != p or p >= alpha or abs(mean_diff) <= TIE:
        return "no difference"
    return "A" if mean_diff > 0 else "B"


def compare_values(a: list[float], b: list[float], *, resamples: int = 10000, seed: int = 0) -> dict:
    """Paired statistics of a - b over documents."""
    diffs = [x - y for x, y in zip(a, b)]
    lo, hi = bootstrap_interval(diffs, resamples=resamples, seed=seed)
    n = len(diffs)
    return {
        "documents": n,
        "mean_a": sum(a) / n if n else math.nan,
        "mean_b": sum(b) / n if n else math.nan,
        "mean_diff": sum(diffs) / n if n else math.nan,
        "ci_low": lo,
        "ci_high": hi,
        "p": permutation_p(diffs, resamples=resamples, seed=seed),
        "wins": sum(d > TIE for d in diffs),
        "ties": sum(abs(d) <= TIE for d in diffs),
        "losses": sum(d < -TIE for d in diffs),
    }


def system_mean(values: list[float], *, resamples: int = 10000, seed: int = 0) -> dict:
    lo, hi = bootstrap_interval(values, resamples=resamples, seed=seed)
    return {"mean": sum(values) / len(values) if values else math.nan, "ci_low": lo, "ci_high": hi}


def compare_systems(
    systems: list[System],
    *,
    fields: tuple[str, ...] | None = None,
    allow_mixed: bool = False,
    resamples: int = 10000,
    seed: int = 0,
    drill: int = 5,
) -> dict:
    """The whole comparison as a JSON-ready dict (see the module docstring)."""
    mixed = _comparable(systems, allow_mixed)
    metric = systems[0].metric
    fields = fields or FIELDS.get(metric, ("score",))
    docs = common_documents(systems)
    if not docs:
        raise InputError(
            "the systems share no scored document (check --by, or that they scored the same sources)",
            cause="no_common_documents",
        )
    fields = tuple(f for f in fields if all(isinstance(s.rows[d].get(f), (int, float)) for s in systems for d in docs))
    report: dict[str, Any] = {
        "metric": metric,
        "fields": list(fields),
        "documents": len(docs),
        "alpha": ALPHA,
        "resamples": resamples,
        "seed": seed,
        "settings_differ": mixed,
        "systems": [_system_counts(s, docs) for s in systems],
        "means": {
            s.name: {f: system_mean([s.rows[d][f] for d in docs], resamples=resamples, seed=seed) for f in fields}
            for s in systems
        },
        "pairs": [],
    }
    for a, b in itertools.combinations(systems, 2):
        pair = {"a": a.name, "b": b.name, "fields": {}}
        for f in fields:
            pair["fields"][f] = compare_values(
                [a.rows[d][f] for d in docs], [b.rows[d][f] for d in docs], resamples=resamples, seed=seed
            )
        pair["drill_down"] = drill_down(a, b, docs, drill)
        report["pairs"].append(pair)
    for f in fields:  # Holm over the pairs, per field
        stats = [p["fields"][f] for p in report["pairs"]]
        for s, adj in zip(stats, holm([s["p"] for s in stats])):
            s["p_holm"] = adj
            s["verdict"] = verdict(s["mean_diff"], adj)
    report["ranking"] = sorted(
        (s.name for s in systems), key=lambda n: -report["means"][n]["score"]["mean"] if "score" in fields else n
    )
    return report


def _system_counts(s: System, docs: list) -> dict:
    return {
        "name": s.name,
        "scored": len(s.rows),
        "failed": len(s.failed),
        "unkeyed": len(s.unkeyed),
        "duplicates": len(s.duplicates),
        "not_in_every_system": len(set(s.rows) - set(docs)),
        "signature": s.signature,
    }


def _comparable(systems: list[System], allow_mixed: bool) -> dict:
    """Refuses systems that cannot be compared (fewer than two, no rows, mixed metrics, or mixed settings unless
    allowed); returns the settings that differ."""
    if len(systems) < 2:
        raise InputError("needs at least two systems' rows to compare", cause="too_few_systems")
    empty = [s.name for s in systems if not s.rows]
    if empty:
        raise InputError(f"has no scored rows with a document key: {', '.join(empty)}", cause="no_rows")
    metrics = {s.metric for s in systems}
    if len(metrics) > 1:
        raise InputError(
            f"mixes metrics ({', '.join(sorted(metrics))}): their scores do not compare", cause="mixed_metrics"
        )
    mixed = differences(systems)
    if mixed and not allow_mixed:
        named = "; ".join(
            f"{k}: " + ", ".join(f"{s.name}={v!r}" for s, v in zip(systems, values))
            for k, values in list(mixed.items())[:5]
        )
        raise InputError(
            f"compares rows scored under different settings ({named}); rescore under one setting, or "
            f"pass --allow-mixed to compare them anyway",
            cause="mixed_settings",
        )
    return mixed


def _missed(row: dict) -> dict:
    """A row's unsupported claims and missed coverage items (two-axis), or unanswered questions (Ragas)."""
    if row.get("metric") == "summary-score":
        return {
            "unsupported": [],
            "missed": [q for q, a in zip(row.get("questions") or [], row.get("answers") or []) if str(a) != "1"],
        }
    items = row.get("questions") or []
    verdicts = row.get("coverage_verdicts") or []
    return {
        "unsupported": [c.get("claim") for c in row.get("claims") or [] if not c.get("supported")],
        "missed": [q for q, v in zip(items, verdicts) if not v.get("answered")],
    }


def drill_down(a: System, b: System, docs: list[str], n: int) -> list[dict]:
    """The n documents where the two systems' scores differ most, each side's misses next to each other."""
    ranked = sorted(docs, key=lambda d: (-abs(a.rows[d]["score"] - b.rows[d]["score"]), d))[:n]
    return [
        {
            "document": d,
            "id_a": row_name(a.rows[d], a.id_field),
            "id_b": row_name(b.rows[d], b.id_field),
            "score_a": a.rows[d]["score"],
            "score_b": b.rows[d]["score"],
            "a": _missed(a.rows[d]),
            "b": _missed(b.rows[d]),
        }
        for d in ranked
    ]


def verdict_label(pair: dict, stats: dict) -> str:
    """A pair's verdict on one field in words: "<A> better", "<B> better" or "no difference"."""
    return {"A": f"{pair['a']} better", "B": f"{pair['b']} better"}.get(stats["verdict"], "no difference")


def left_out(system: dict) -> str:
    """Why a system's rows were left out, by cause (a report's "systems" entry)."""
    return (
        f"{system['failed']} failed, {system['unkeyed']} with no document key, {system['duplicates']} "
        f"duplicate, {system['not_in_every_system']} on documents another system did not score"
    )


NAME_WIDTH = 16  # a system's name as a column heads with it: longer ones are cut


def pair_table(pair: dict) -> list[str]:
    """One pair's lines of the terminal table: a header that names the two systems in its columns ("mean sysA",
    "sysA - sysB"), then a row per field, every figure under the column of the system it is: the pair's own order,
    whatever the systems are called (letters in the header read "A B" over rows of systems named "B" and "A")."""
    a, b = pair["a"][:NAME_WIDTH], pair["b"][:NAME_WIDTH]
    mean_a, mean_b, diff = f"mean {a}", f"mean {b}", f"{a} - {b}"
    wide, wide_diff = max(7, len(mean_a), len(mean_b)), max(7, len(diff))
    header = (
        f"{'field':<15} {mean_a:>{wide}} {mean_b:>{wide}} {diff:>{wide_diff}} {'95% CI':>17} "
        f"{'p':>7} {'p Holm':>7} {'W/T/L':>11}  verdict"
    )
    lines = [header, "-" * len(header)]
    for f, s in pair["fields"].items():
        lines.append(
            f"{f:<15} {s['mean_a']:>{wide}.3f} {s['mean_b']:>{wide}.3f} {s['mean_diff']:>+{wide_diff}.3f} "
            f"[{s['ci_low']:>+7.3f},{s['ci_high']:>+7.3f}] {s['p']:>7.4f} {s['p_holm']:>7.4f} "
            f"{s['wins']:>3}/{s['ties']}/{s['losses']:<3}  {verdict_label(pair, s)}"
        )
    return lines


def table(report: dict) -> str:
    """The terminal table: per pair (pair_table) and field, the difference, its interval, p (Holm), W/T/L and the
    verdict."""
    lines = [
        f"{report['documents']} documents scored by every system ({report['metric']}); "
        f"paired bootstrap 95% intervals ({report['resamples']} resamples, seed {report['seed']}), "
        f"permutation p-values, Holm-adjusted over {len(report['pairs'])} pair(s)."
    ]
    for s in report["systems"]:
        dropped = s["failed"] + s["unkeyed"] + s["duplicates"] + s["not_in_every_system"]
        if dropped:
            lines.append(f"  {s['name']}: {dropped} row(s) left out: {left_out(s)}")
    if report["settings_differ"]:
        lines.append("  --allow-mixed: settings differ on " + ", ".join(report["settings_differ"]))
    for pair in report["pairs"]:
        lines += ["", *pair_table(pair)]
    if len(report["systems"]) > 2 and "score" in report["fields"]:
        lines += ["", "ranking by mean score (95% CI):"]
        for k, name in enumerate(report["ranking"], 1):
            m = report["means"][name]["score"]
            lines.append(f"  {k}. {name}: {m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]")
        lines.append("  (intervals per system do not test differences: read the Holm-adjusted pairs above)")
    return "\n".join(lines)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=1, ensure_ascii=False, default=str)
