"""What a rung's rows hold: their verdicts, the flips between two rungs, the NaN values among their numbers, and
each row's outcome (score, verdicts, P(yes) or the error) as the ladder writes it for a later comparison."""

from __future__ import annotations


def verdicts(result) -> list[bool]:
    if getattr(result, "error", None):
        return []
    return [c["supported"] for c in result.claims] + [v["answered"] for v in result.coverage_verdicts]


def flip_rate(base, other) -> float:
    flips = total = 0
    for a, b in zip(base, other):
        va, vb = verdicts(a), verdicts(b)
        total += max(len(va), len(vb))
        flips += sum(x != y for x, y in zip(va, vb)) + abs(len(va) - len(vb))
    return flips / total if total else 0.0


def nan_count(results) -> int:
    """NaN anywhere a verdict's number lands (each stage's P(yes), each claim's and coverage item's P(yes) and
    PMI, the scores): a poisoned attention row shows up here even where the JSON stays valid."""

    def nan(v) -> bool:
        return isinstance(v, float) and v != v

    count = 0
    for r in results:
        for audit in (getattr(r, "stages", None) or {}).values():
            count += sum(map(nan, audit.get("p_yes") or []))
        for item in (getattr(r, "claims", None) or []) + (getattr(r, "coverage_verdicts", None) or []):
            count += sum(nan(item.get(k)) for k in ("p_supported", "p_answered", "pmi"))
        count += sum(
            nan(getattr(r, name, None))
            for name in ("score", "alignment", "coverage", "soft_alignment", "soft_coverage")
        )
    return count


def row_outcomes(outputs: dict) -> dict:
    """Every rung's rows as their outcomes (score, each verdict and its probability, or the error): what two runs of
    the ladder, before and after a change, compare with research/compare_ladders.py."""

    def outcome(result) -> dict:
        if getattr(result, "error", None):
            return {"id": result.id, "error": result.error.get("cause")}
        return {
            "id": result.id,
            "score": result.score,
            "verdicts": verdicts(result),
            "p": [c.get("p_supported") for c in result.claims]
            + [v.get("p_answered") for v in result.coverage_verdicts],
        }

    return {
        workload: {rung: [outcome(r) for r in results] for rung, results in rungs.items()}
        for workload, rungs in outputs.items()
    }
