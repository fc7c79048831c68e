"""What a claim is asked as, in a likelihood verdict: candidate instructions compared on the embedded judge.

    python benchmarks/likelihood_prompts.py                 # profiles missing ones (about 8 minutes a candidate)
    python benchmarks/likelihood_prompts.py --table-only    # the table from the profiles already there

The likelihood verdict scores a claim as the judge's reply to the source and one instruction
(prompts.likelihood_prompt). Each candidate below is put in the product's place for it (prompts.LIKELIHOOD_INSTRUCTION)
and every statement profiled as benchmarks/token_profiles.py does, into results/runs/likelihood_prompts/<name>/.
Figures, under the product's verdict rule (benchmarks/verdict_rules.CHOSEN): FRANK sentence ROC AUC per collection,
the share of faithful and of erroneous sentences on the right side of the 2.0 threshold, REALSumm key-fact balanced
accuracy, SummEval Spearman of a summary's mean P(yes) with expert consistency on the 10 development documents that
benchmarks/agreement.py picks, and on the **other 48 documents of the file** (the check: no choice looked at them
first), with a bootstrap interval over documents; and the perturbation set where it was profiled (--sets).
Writes results/likelihood_prompts.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import token_profiles as tp  # noqa: E402
import verdict_rules as vr  # noqa: E402

from offline_sumscore.analysis.agreement import balanced_accuracy, bootstrap_interval, roc_auc, spearman  # noqa: E402
from offline_sumscore.core import prompts  # noqa: E402

CANDIDATES = {
    "quote": "Quote one sentence stated in the article.",  # the product's
    "summary": "Summarize the article in one sentence.",
    "true": "Write one sentence that is true according to the article.",
    "summary-no-length": "Summarize the article.",
}
OUT = HERE / "results" / "runs" / "likelihood_prompts"


def summeval_rest() -> list[dict]:
    """Every summary sentence of the SummEval file's documents that agreement.py's 10-document pick leaves out."""
    from agreement import pick_documents

    items = tp.jsonl("summeval_dev.jsonl")
    dev = {item["id"] for item in pick_documents(items, "summaries", 10, None, 0)}
    return tp.sentence_statements([item for item in items if item["id"] not in dev])


SETS = {**tp.SETS, "summeval_rest": summeval_rest}


def profile_missing(names: list[str], sets: list[str]) -> None:
    from offline_sumscore.engine.judge import load_judge
    from offline_sumscore.engine.local import TransformersEngine

    engine = None
    kept = prompts.LIKELIHOOD_INSTRUCTION
    try:
        for name in names:
            prompts.LIKELIHOOD_INSTRUCTION = CANDIDATES[name]
            for set_name in sets:
                path = OUT / name / f"token_profiles_{set_name}.json"
                if path.exists():
                    continue
                engine = engine or TransformersEngine(load_judge())
                statements = SETS[set_name]()
                started = time.perf_counter()
                tp.profile(engine, statements)
                path.parent.mkdir(parents=True, exist_ok=True)
                seconds = time.perf_counter() - started
                path.write_text(json.dumps({"set": set_name, "seconds": seconds, "statements": statements}) + "\n")
                print(f"{name} / {set_name}: {len(statements)} statements in {seconds:.0f} s", flush=True)
    finally:
        prompts.LIKELIHOOD_INSTRUCTION = kept


def load(name: str, set_name: str) -> list[dict] | None:
    return vr.read_profiles(OUT / name / f"token_profiles_{set_name}.json")


def summary_spearman(statements: list[dict], rule) -> tuple[float, tuple[float, float] | None]:
    means = vr.summary_means(rule, statements)
    x, y = [m["p"] for m in means], [m["consistency"] for m in means]
    interval = bootstrap_interval(
        lambda idx: spearman([x[i] for i in idx], [y[i] for i in idx]), [m["doc_id"] for m in means]
    )
    return spearman(x, y), interval


def figures(name: str) -> dict:
    rule = vr.RULES[vr.CHOSEN]
    out: dict = {"instruction": CANDIDATES[name]}
    frank = load(name, "frank")
    if frank:
        for part in ("bbc", "cnndm"):
            mine = [s for s in frank if s["part"] == part]
            out[f"FRANK {part} AUC"] = roc_auc([not s["error"] for s in mine], [rule(s) for s in mine])
            faithful = [rule(s) >= vr.THRESHOLD for s in mine if not s["error"]]
            wrong = [rule(s) < vr.THRESHOLD for s in mine if s["error"]]
            out[f"FRANK {part} faithful pass"] = sum(faithful) / len(faithful)
            out[f"FRANK {part} errors fail"] = sum(wrong) / len(wrong)
    realsumm = load(name, "realsumm")
    if realsumm:
        out["REALSumm BA"] = balanced_accuracy(
            [s["present"] for s in realsumm], [rule(s) >= vr.THRESHOLD for s in realsumm]
        )
    for set_name, label in (("summeval", "SummEval dev 10"), ("summeval_rest", "SummEval other 48")):
        statements = load(name, set_name)
        if statements:
            out[label], out[f"{label} interval"] = summary_spearman(statements, rule)
    perturbations = load(name, "perturbations")
    if perturbations:
        f = vr.perturbation_figures(rule, perturbations)
        for part in ("summeval", "frank"):
            out[f"perturbations {part} lowest pairwise"] = min(f[f"{part} {t}"] for t in vr.TYPES if f"{part} {t}" in f)
            out[f"perturbations {part} paraphrases pass"] = f[f"{part} paraphrase pass"]
    return out


def table(report: dict) -> str:
    columns = [
        "FRANK bbc AUC", "FRANK bbc faithful pass", "FRANK bbc errors fail", "FRANK cnndm AUC", "REALSumm BA",
        "SummEval dev 10", "SummEval other 48", "perturbations summeval lowest pairwise",
        "perturbations frank lowest pairwise", "perturbations frank paraphrases pass",
    ]  # fmt: skip

    def cell(f: dict, c: str) -> str:
        if c not in f or f[c] is None:
            return "-"
        interval = f.get(f"{c} interval")
        return f"{f[c]:.3f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")

    lines = ["| instruction | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for f in report.values():
        lines.append(f"| {f['instruction']} | " + " | ".join(cell(f, c) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--sets", default="frank,summeval,summeval_rest,realsumm")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    names = args.candidates.split(",")
    if not args.table_only:
        profile_missing(names, args.sets.split(","))
    report = {name: figures(name) for name in names}
    text = table(report)
    (HERE / "results" / "likelihood_prompts.json").write_text(json.dumps(report, indent=1) + "\n")
    (HERE / "results" / "likelihood_prompts.md").write_text("# What a claim is asked as\n" + HEADER + "\n" + text)
    print(text)


HEADER = """
`python benchmarks/likelihood_prompts.py` (the embedded judge; each candidate in the place of the instruction a
likelihood statement is scored after), under the product's verdict rule; the 2.0 threshold and the rule were left as
they are for every candidate. REALSumm's column scores its key facts with the candidate too (in the product they are
coverage statements, asked as quotes whatever the claims are asked as). The profiles were taken at bb11d13, before a
period after an abbreviation stopped ending a sentence: the SummEval sets' sentences are split as they were then,
the same for every candidate.

Why the question was asked: "Quote one sentence stated in the article" asks for a copy, and an abstractive summary
sentence is not one; FRANK's BBC/XSum sentences (abstractive) are where the embedded judge ranks worst. Reading:
"Summarize the article in one sentence." ranks FRANK better in both collections, but SummEval's summaries worse on
the development documents and on the 48 documents no choice looked at (0.371 -> 0.337), passes fewer paraphrase
controls (99% -> 94%), and the same instruction without "in one sentence" loses on BBC/XSum (0.671): the FRANK
gains hang on the wording and sit inside FRANK's intervals (BBC/XSum has 23 faithful sentences, CNN/DM 6 wrong
ones). No candidate is better everywhere, and the quote instruction stays.
"""

if __name__ == "__main__":
    main()
