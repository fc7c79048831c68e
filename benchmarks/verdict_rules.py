"""Likelihood verdict rules compared on token profiles (benchmarks/token_profiles.py), without the model.

    python benchmarks/verdict_rules.py            # every rule on every set; writes results/verdict_rules.{md,json}

A rule maps a statement's token profile to a score in nats per token; the verdict is score >= 2.0 (the product's
threshold) and P(yes) = sigmoid(score - 2.0), as the product reads them. Reported per rule: on the perturbation set,
pairwise accuracy per type (the original scores above its perturbed copy) and the share of paraphrase controls that
pass, for the "summeval" part (where rules are chosen) and the "frank" part (held out); FRANK sentence ROC AUC by
collection (P(yes) against the human "no error" label); SummEval dev (10 documents) Spearman of the summary's mean
P(yes) with expert consistency; REALSumm key-fact balanced accuracy (verdict against the human "present" label).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "runs"
THRESHOLD = 2.0
NEGATIONS = {"not", "n't", "never", "no", "nor", "cannot", "without"}


def typed(text: str) -> bool:
    """A token whose substitution changes a fact: a number, a name (capitalized), a negation."""
    word = text.strip().strip("\"'.,;:!?()")
    return bool(word) and (any(c.isdigit() for c in word) or word[0].isupper() or word.lower() in NEGATIONS)


def conflicts(s: dict, confident: float = 0.5) -> list[float]:
    """PMIs of the tokens where the text makes the judge confident (p >= confident) of another token, and the two
    are of the kind whose swap changes a fact (numbers, names, negations)."""
    out = []
    for tok, lp, bp, exp, elp in zip(s["tokens"], s["logp"], s["base"], s["expected"], s["expected_logp"]):
        if exp.strip() != tok.strip() and math.exp(elp) >= confident and (typed(tok) or typed(exp)):
            out.append(lp - bp)
    return out


def mean_pmi(s: dict) -> float:
    return sum(a - b for a, b in zip(s["logp"], s["base"])) / len(s["logp"])


def rule_mean(s):
    return mean_pmi(s)


def rule_min(s):
    return min(a - b for a, b in zip(s["logp"], s["base"]))


def rule_low3(s):
    pmis = sorted(a - b for a, b in zip(s["logp"], s["base"]))
    return sum(pmis[:3]) / len(pmis[:3])


def rule_conflict(weight: float, confident: float = 0.5):
    def rule(s):
        found = conflicts(s, confident)
        return mean_pmi(s) + weight * min(0.0, min(found, default=0.0))

    rule.__name__ = f"mean + {weight} x typed conflict (p >= {confident})"
    return rule


RULES = {
    "mean PMI (today)": rule_mean,
    "min token PMI": rule_min,
    "mean of 3 lowest": rule_low3,
    **{r.__name__: r for r in (rule_conflict(w, c) for w in (0.5, 1.0) for c in (0.5, 0.8))},
}


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def auc(positive: list[float], negative: list[float]) -> float:
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative)) if positive and negative else float("nan")


def spearman(x: list[float], y: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def balanced_accuracy(truth: list[bool], said: list[bool]) -> float:
    pos = [s for t, s in zip(truth, said) if t]
    neg = [not s for t, s in zip(truth, said) if not t]
    return (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2


def load(name: str) -> list[dict]:
    path = RUNS / f"token_profiles_{name}.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run benchmarks/token_profiles.py --sets {name}")
    return [s for s in json.loads(path.read_text())["statements"] if "logp" in s]


def perturbation_figures(rule, statements: list[dict]) -> dict:
    by = {}
    for s in statements:
        by.setdefault((s["part"], s["type"], s["id"]), {})[s["role"]] = rule(s)
    out = {}
    for part in ("summeval", "frank"):
        mine = {k: v for k, v in by.items() if k[0] == part and len(v) == 3}
        for kind in sorted({k[1] for k in mine}):
            pairs = [v for k, v in mine.items() if k[1] == kind]
            out[f"{part} {kind}"] = sum(v["original"] > v["perturbed"] for v in pairs) / len(pairs)
        out[f"{part} paraphrase pass"] = sum(v["paraphrase"] >= THRESHOLD for v in mine.values()) / len(mine)
        out[f"{part} original pass"] = sum(v["original"] >= THRESHOLD for v in mine.values()) / len(mine)
    return out


def dataset_figures(rule, frank, summeval, realsumm) -> dict:
    out = {}
    for part in ("bbc", "cnndm"):
        mine = [s for s in frank if s["part"] == part]
        p = [sigmoid(rule(s) - THRESHOLD) for s in mine]
        out[f"FRANK {part} AUC"] = auc(
            [q for q, s in zip(p, mine) if not s["error"]], [q for q, s in zip(p, mine) if s["error"]]
        )
    by = {}
    for s in summeval:
        by.setdefault(s["id"], (s["consistency"], []))[1].append(sigmoid(rule(s) - THRESHOLD))
    out["SummEval Spearman"] = spearman([sum(v[1]) / len(v[1]) for v in by.values()], [v[0] for v in by.values()])
    out["REALSumm BA"] = balanced_accuracy([s["present"] for s in realsumm], [rule(s) >= THRESHOLD for s in realsumm])
    return out


def main() -> None:
    perturbations, frank = load("perturbations"), load("frank")
    summeval, realsumm = load("summeval"), load("realsumm")
    report = {}
    for name, rule in RULES.items():
        report[name] = {**perturbation_figures(rule, perturbations), **dataset_figures(rule, frank, summeval, realsumm)}
    columns = list(next(iter(report.values())))
    lines = ["| rule | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, figures in report.items():
        lines.append(f"| {name} | " + " | ".join(f"{figures[c]:.3f}" for c in columns) + " |")
    (HERE / "results" / "verdict_rules.json").write_text(json.dumps(report, indent=1) + "\n")
    (HERE / "results" / "verdict_rules.md").write_text("# Likelihood verdict rules\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
