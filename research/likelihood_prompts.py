"""What a claim is asked as, in a likelihood verdict: candidate instructions compared on the embedded judge.

    python -m research.likelihood_prompts                 # profiles missing ones (about 8 minutes a candidate)
    python -m research.likelihood_prompts --table-only    # the table from the profiles already there

The likelihood verdict scores a claim as the judge's reply to the source and one instruction
(likelihood_prompt). Each candidate below is put in the product's place for it (LIKELIHOOD_INSTRUCTION)
and every statement profiled as research/token_profiles.py does, into results/runs/likelihood_prompts/<name>/.
Figures, under the product's verdict rule (research/verdict_rules.CHOSEN): FRANK sentence ROC AUC per collection,
the share of faithful and of erroneous sentences on the right side of the 2.0 threshold, REALSumm key-fact balanced
accuracy, SummEval Spearman of a summary's mean P(yes) with expert consistency on the 10 development documents that
benchmarks/agreement.py picks, and on the **other 48 documents of the file** (the check: no choice looked at them
first), with a bootstrap interval over documents; and the perturbation set where it was profiled (--sets).
Writes results/likelihood_prompts.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from benchmarks.lib.agreement_stats import balanced_accuracy, roc_auc, spearman
from offline_sumscore.analysis.bootstrap import bootstrap_interval
from research import token_profiles as tp
from research import verdict_rules as vr

HERE = Path(__file__).resolve().parent

CANDIDATES = {
    "quote": "Quote one sentence stated in the article.",  # the product's, for a sentence of a longer summary
    "summary": "Summarize the article in one sentence.",  # the product's, for a summary of one sentence
    "true": "Write one sentence that is true according to the article.",
    "summary-no-length": "Summarize the article.",
}
PRODUCT = "product"  # a summary of one sentence asked as "summary", every other statement as "quote"
OUT = HERE / "results" / "runs" / "likelihood_prompts"


def summeval_rest() -> list[dict]:
    """Every summary sentence of the SummEval file's documents that agreement.py's 10-document pick leaves out."""
    from benchmarks.lib.agreement_items import pick_documents

    items = tp.jsonl("summeval_dev.jsonl")
    dev = {item["id"] for item in pick_documents(items, "summaries", 10, None, 0)}
    return tp.sentence_statements([item for item in items if item["id"] not in dev])


SETS = {**tp.SETS, "summeval_rest": summeval_rest}


def profile_missing(names: list[str], sets: list[str]) -> None:
    from offline_sumscore.engine.judge import load_judge
    from offline_sumscore.engine.local import TransformersEngine
    from offline_sumscore.scorers.stages import verdict as stage  # its instructions are swapped per candidate

    engine = None
    kept = stage.LIKELIHOOD_INSTRUCTION, stage.ONE_SENTENCE_SUMMARY_INSTRUCTION
    try:
        for name in names:
            # Every statement asked with the candidate, a summary of one sentence too.
            stage.LIKELIHOOD_INSTRUCTION = stage.ONE_SENTENCE_SUMMARY_INSTRUCTION = CANDIDATES[name]
            for set_name in sets:
                path = OUT / name / f"token_profiles_{set_name}.json"
                if path.exists():
                    continue
                engine = engine or TransformersEngine(load_judge("smollm2-135m"))
                statements = SETS[set_name]()
                started = time.perf_counter()
                tp.profile(engine, statements)
                path.parent.mkdir(parents=True, exist_ok=True)
                seconds = time.perf_counter() - started
                path.write_text(json.dumps({"set": set_name, "seconds": seconds, "statements": statements}) + "\n")
                print(f"{name} / {set_name}: {len(statements)} statements in {seconds:.0f} s", flush=True)
    finally:
        stage.LIKELIHOOD_INSTRUCTION, stage.ONE_SENTENCE_SUMMARY_INSTRUCTION = kept


def load(name: str, set_name: str) -> list[dict] | None:
    if name == PRODUCT:
        quote, summary = load("quote", set_name), load("summary", set_name)
        if set_name in ("realsumm", "perturbations") or not (quote and summary):
            return quote  # key facts are coverage statements, and a perturbed sentence a claim: quotes
        return vr.as_product(quote, summary)
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
    out: dict = {
        "instruction": CANDIDATES.get(
            name, "The product: a summary of one sentence as the second, others as the first."
        )
    }
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


def paired_gain(rule, better: str, than: str, part: str, resamples: int = 2000) -> dict:
    """FRANK part's ROC AUC under instruction better less under than, on the same sentences, with its 95% interval
    and the share of resamples of whole documents where it is above 0."""
    a, b = load(better, "frank"), load(than, "frank")
    a, b = [s for s in a if s["part"] == part], [s for s in b if s["part"] == part]
    assert [s["statement"] for s in a] == [s["statement"] for s in b]
    labels, x, y = [not s["error"] for s in a], [rule(s) for s in a], [rule(s) for s in b]

    def gain(mine: list[bool], idx) -> float:
        return roc_auc(mine, [x[i] for i in idx]) - roc_auc(mine, [y[i] for i in idx])

    seen, interval = vr.document_resamples(a, gain, resamples)
    return {
        "gain": roc_auc(labels, x) - roc_auc(labels, y),
        "interval": interval,
        "above": sum(g > 0 for g in seen) / len(seen),
    }


def one_sentence_summaries(rule) -> dict:
    """SummEval's summaries of one sentence (the only ones outside FRANK here), Spearman with expert consistency of
    each, asked as a quote and as a one-sentence summary: the product's split put to data it was not chosen on."""
    out = {}
    for set_name in ("summeval", "summeval_rest"):
        for name in ("quote", "summary"):
            statements = load(name, set_name) or []
            sentences = Counter(s["id"] for s in statements)
            means = vr.summary_means(rule, [s for s in statements if sentences[s["id"]] == 1])
            if len(means) > 2:
                out[f"{set_name} {name}"] = (
                    spearman([m["p"] for m in means], [m["consistency"] for m in means]),
                    len(means),
                )
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
    ap.add_argument(
        "--data-dir", type=Path, help="the folder holding the agreement files (not needed with --table-only)"
    )
    args = ap.parse_args()
    if not args.table_only and args.data_dir is None:
        ap.error("--data-dir is needed to profile (the folder holding the agreement files); --table-only needs none")
    tp.DATA = args.data_dir
    names = args.candidates.split(",")
    if not args.table_only:
        profile_missing(names, args.sets.split(","))
    report = {name: figures(name) for name in [*names, PRODUCT]}
    text = table(report)
    rule = vr.RULES[vr.CHOSEN]
    report["paired"] = {part: paired_gain(rule, "summary", "quote", part) for part in ("bbc", "cnndm")}
    for part, g in report["paired"].items():
        low, high = g["interval"]
        text += (
            f"\nFRANK {part}, one-sentence summary less quote, on the same sentences: {g['gain']:+.3f} [{low:+.3f},"
            f" {high:+.3f}]; above 0 in {g['above']:.0%} of 2,000 resamples of documents.\n"
        )
    report["one-sentence summaries"] = one_sentence_summaries(rule)
    for key, (rho, n) in report["one-sentence summaries"].items():
        text += f"\nSummEval summaries of one sentence, {key}: Spearman {rho:.3f} ({n} summaries).\n"
    (HERE / "results" / "likelihood_prompts.json").write_text(json.dumps(report, indent=1) + "\n")
    (HERE / "results" / "likelihood_prompts.md").write_text("# What a claim is asked as\n" + HEADER + "\n" + text)
    print(text)


HEADER = """
`python -m research.likelihood_prompts` (the embedded judge; each candidate in the place of the instruction a
likelihood statement is scored after), under the product's verdict rule; the 2.0 threshold and the rule were left as
they are for every candidate. REALSumm's column scores its key facts with the candidate too (in the product they are
coverage statements, asked as quotes whatever the claims are asked as). The profiles were taken at bb11d13, before a
period after an abbreviation stopped ending a sentence: the SummEval sets' sentences are split as they were then,
the same for every candidate.

Why the question was asked: "Quote one sentence stated in the article" asks for a copy, and an abstractive summary
sentence is not one; FRANK's BBC/XSum sentences (abstractive) are where the embedded judge ranks worst. Reading:
"Summarize the article in one sentence." ranks FRANK better in both collections, but SummEval's summaries worse on
the development documents and on the 48 documents no choice looked at (0.371 -> 0.337), passes fewer paraphrase
controls (99% -> 94%), and the same instruction without "in one sentence" loses on BBC/XSum (0.671). No candidate
is better everywhere.

What the product does (the last row): it asks each statement for what it is. A summary of one sentence is the
whole article in one line, and is asked as the judge's one-sentence summary; a sentence of a longer summary is
asked as a quote, which held on SummEval. Where this was chosen, and what checks it: the split was read off this
table, so BBC/XSum's 0.737 (138 of its 140 summaries are one sentence) is not a held-out figure. On the same BBC/XSum
sentences the one-sentence instruction ranks better in 97% of paired resamples of documents (lines under the
table). The only other summaries of one sentence here are 27 of SummEval's (CNN/DM news, mostly the lead sentence
copied): on the 21 among the 48 documents nothing was chosen on, the quote ranks them a little better (0.703
against 0.656; 21 summaries). The gain is for summaries written as XSum writes them, abstractive; the check that
counts is on single-sentence summaries this project does not hold.
"""

if __name__ == "__main__":
    main()
