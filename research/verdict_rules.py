"""Likelihood verdict rules compared on token profiles (research/token_profiles.py), without the model.

    python -m research.verdict_rules            # every rule on every set; writes results/verdict_rules.{md,json}

A rule maps a statement's token profile to a score in nats per token; the verdict is score >= 2.0 (the product's
threshold) and P(yes) = sigmoid(score - 2.0), as the product reads them; a rule not in nats gets its own threshold,
the one with the best balanced accuracy on FRANK's sentences. Reported per rule: on the perturbation set,
pairwise accuracy per type (the original scores above its perturbed copy) and the share of paraphrase controls that
pass, for the "summeval" part (where rules are chosen) and the "frank" part (held out); FRANK sentence ROC AUC by
collection (P(yes) against the human "no error" label); SummEval dev (10 documents) Spearman of the summary's mean
P(yes) with expert consistency; REALSumm key-fact balanced accuracy (verdict against the human "present" label).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path

from benchmarks.lib.agreement_stats import balanced_accuracy, roc_auc, spearman
from offline_sumscore.analysis.bootstrap import bootstrap_interval
from offline_sumscore.core.coverage_items import content_words
from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.scorers.stages.likelihood import fact_kind, typed_conflict

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "runs"
THRESHOLD = 2.0
FRANK_TARGETS = {"bbc": 0.72, "cnndm": 0.84}  # issue 29's, per collection


def worst_conflict(s: dict, confident: float, same_kind: bool) -> float:
    """The PMI of the statement's worst fact conflict (0 where it has none with a negative PMI): a token where the
    text makes the judge confident (p >= confident) of another token, and the swap changes a fact. same_kind=True is
    the product's own typed_conflict (number for number, name for name, or a negation on one side only);
    same_kind=False, the first rule tried: either side a number, a name or a negation."""
    if same_kind:
        text = Likelihood(
            mean_logprob=0.0,
            tokens=len(s["tokens"]),
            token_texts=s["tokens"],
            token_logprobs=s["logp"],
            expected_texts=s["expected"],
            expected_logprobs=s["expected_logp"],
        )
        base = Likelihood(mean_logprob=0.0, tokens=len(s["tokens"]), token_logprobs=s["base"])
        conflict = typed_conflict(text, base, confident, context=s.get("text"))
        return conflict["pmi"] if conflict else 0.0
    rows = zip(s["tokens"], s["logp"], s["base"], s["expected"], s["expected_logp"])
    conflicts = [
        lp - bp
        for tok, lp, bp, exp, elp in rows
        if exp.strip() != tok.strip() and math.exp(elp) >= confident and (fact_kind(tok) or fact_kind(exp))
    ]
    return min(0.0, min(conflicts, default=0.0))


def pmis(s: dict) -> list[float]:
    """The statement's PMI per token: its log-probability with the text less that without it."""
    return [a - b for a, b in zip(s["logp"], s["base"])]


def mean_pmi(s: dict) -> float:
    return sum(pmis(s)) / len(s["logp"])


def rule_mean(s):
    return mean_pmi(s)


def rule_min(s):
    return min(pmis(s))


def rule_low3(s):
    lowest = sorted(pmis(s))[:3]
    return sum(lowest) / len(lowest)


def rule_conflict(weight: float, confident: float = 0.5, same_kind: bool = True):
    def rule(s):
        return mean_pmi(s) + weight * worst_conflict(s, confident, same_kind)

    rule.__name__ = f"mean + {weight} x {'same-kind' if same_kind else 'typed'} conflict (p >= {confident})"
    return rule


def share_explained(s: dict) -> float:
    """The share of the statement's surprisal without the text that the text explains: sum of PMIs over the sum of
    -log p(token | no text). 1 for a statement the text makes certain; near 0 for one it does not help with. Unlike
    the mean PMI, it does not grow with how rare the statement's words are."""
    return sum(pmis(s)) / max(1e-9, -sum(s["base"]))


SHARE_WEIGHT = 2.0  # beside the mean: the first weight tried, and the best on SummEval dev of 2, 4, 6 and 8


def rule_share(s):
    return share_explained(s)


def rule_mean_and_share(s):
    return mean_pmi(s) + SHARE_WEIGHT * share_explained(s)


def rule_chosen_and_share(s):
    return RULES[CHOSEN](s) + SHARE_WEIGHT * share_explained(s)


rule_share.__name__ = "share of surprisal explained (own threshold)"
rule_mean_and_share.__name__ = f"mean + {SHARE_WEIGHT:g} x share explained (own threshold)"
rule_chosen_and_share.__name__ = f"mean + {SHARE_WEIGHT:g} x share + 0.5 x same-kind conflict (own threshold)"


_WORD = re.compile(r"[^\W_]+")


def novel_word_share(s: dict) -> float:
    """Minus the share of the statement's content words that the source never writes (lexical, case-folded): an
    invented name or number is one. Needs the source, which the verdict stage does not read."""
    source = {w.lower() for w in _WORD.findall(s["text"])}
    words = content_words(s["statement"])
    return -sum(w not in source for w in words) / max(1, len(words))


def rare_token_mean(s: dict) -> float:
    rare = [x for x, b in zip(pmis(s), s["base"]) if b < -2]
    return sum(rare) / len(rare) if rare else 0.0


# Features tried later, each for one reason to rank an abstractive sentence better than the mean does, all with
# their own threshold; none was chosen (see HEADER).
OTHER_FEATURES = {
    "share of tokens the text makes likelier": lambda s: sum(x > 0 for x in pmis(s)) / len(pmis(s)),
    "mean PMI, each token clipped to [-5, 5]": lambda s: sum(max(-5.0, min(5.0, x)) for x in pmis(s)) / len(pmis(s)),
    "mean PMI of tokens rare without the text (p < e^-2)": rare_token_mean,
    "mean PMI - 0.25 x its spread": lambda s: statistics.mean(pmis(s)) - 0.25 * statistics.pstdev(pmis(s)),
    "minus the share of content words the source never writes": novel_word_share,
}
for name, feature in OTHER_FEATURES.items():
    feature.__name__ = f"{name} (own threshold)"
# Not in nats per token: each of these gets the threshold with the best balanced accuracy on FRANK (main).
OWN_THRESHOLD = (rule_share, rule_mean_and_share, rule_chosen_and_share, *OTHER_FEATURES.values())

RULES = {
    "mean PMI (before)": rule_mean,
    "min token PMI": rule_min,
    "mean of 3 lowest": rule_low3,
    **{r.__name__: r for r in (rule_conflict(w, 0.5, False) for w in (0.5, 1.0, 2.0))},
    **{r.__name__: r for r in (rule_conflict(w, c, True) for w in (0.5, 1.0) for c in (0.5, 0.8))},
    **{r.__name__: r for r in OWN_THRESHOLD},
}
CHOSEN = "mean + 0.5 x same-kind conflict (p >= 0.5)"  # the product's rule (scorers/stages/likelihood.py)


def threshold_of(rule) -> float:
    return getattr(rule, "threshold", THRESHOLD)


def fit_threshold(rule, frank: list[dict]) -> float:
    """The threshold with the best balanced accuracy on FRANK's sentences, as the product's 2.0 nats was set."""
    labels, values = [not s["error"] for s in frank], [rule(s) for s in frank]
    return max(sorted(set(values)), key=lambda t: balanced_accuracy(labels, [v >= t for v in values]))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def read_profiles(path: Path) -> list[dict] | None:
    """The profiled statements of a token_profiles file (those the engine failed have no "logp"); None: no file."""
    if not path.exists():
        return None
    return [s for s in json.loads(path.read_text())["statements"] if "logp" in s]


def as_product(quote: list[dict], summary: list[dict]) -> list[dict]:
    """Statements as the product asks them, from profiles taken under one instruction each
    (research/likelihood_prompts.py): a summary's only sentence from the one-sentence-summary profile, every other
    statement from the quote profile."""
    sentences = Counter(s["id"] for s in quote)
    asked_whole = {(s["id"], s["statement"]): s for s in summary}
    return [asked_whole[s["id"], s["statement"]] if sentences[s["id"]] == 1 else s for s in quote]


def load(name: str) -> list[dict]:
    path = RUNS / f"token_profiles_{name}.json"
    statements = read_profiles(path)
    if statements is None:
        raise SystemExit(f"{path} is missing: run python -m research.token_profiles --sets {name}")
    return statements


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
            out[f"{part} {kind} caught"] = sum(v["perturbed"] < threshold_of(rule) for v in pairs) / len(pairs)
        out[f"{part} paraphrase pass"] = sum(v["paraphrase"] >= threshold_of(rule) for v in mine.values()) / len(mine)
        out[f"{part} original pass"] = sum(v["original"] >= threshold_of(rule) for v in mine.values()) / len(mine)
    return out


def summary_means(rule, statements: list[dict]) -> list[dict]:
    """Per SummEval summary: its sentences' mean P(yes) under rule (the product's soft alignment), its expert
    consistency and its document."""
    by: dict[str, dict] = {}
    for s in statements:
        entry = by.setdefault(s["id"], {"consistency": s["consistency"], "doc_id": s["doc_id"], "ps": []})
        entry["ps"].append(sigmoid(rule(s) - threshold_of(rule)))
    return [dict(e, p=sum(e["ps"]) / len(e["ps"])) for e in by.values()]


def dataset_figures(rule, frank, summeval, summeval_rest, realsumm) -> dict:
    out = {}
    for part in ("bbc", "cnndm"):
        mine = [s for s in frank if s["part"] == part]
        p = [sigmoid(rule(s) - threshold_of(rule)) for s in mine]
        out[f"FRANK {part} AUC"] = roc_auc([not s["error"] for s in mine], p)
    for name, statements in (("SummEval Spearman", summeval), ("SummEval other 48", summeval_rest)):
        means = summary_means(rule, statements)
        out[name] = spearman([m["p"] for m in means], [m["consistency"] for m in means]) if means else None
    present, verdicts = [s["present"] for s in realsumm], [rule(s) >= threshold_of(rule) for s in realsumm]
    out["REALSumm BA"] = balanced_accuracy(present, verdicts)
    return out


def document_resamples(statements: list[dict], statistic, resamples: int = 2000) -> tuple[list[float], tuple]:
    """statistic(labels, indices) over bootstrap resamples of whole FRANK documents (as the agreement benchmark's
    intervals resample), skipping a resample whose sentences are all faithful or all wrong; labels are "no error".
    Returns every resample's value and the 95% interval."""
    labels = [not s["error"] for s in statements]
    seen: list[float] = []  # every resample's value, collected as the interval is computed

    def value(idx) -> float | None:
        mine = [labels[i] for i in idx]
        if all(mine) or not any(mine):
            return None
        seen.append(statistic(mine, idx))
        return seen[-1]

    docs = [s["id"].split(":")[1] for s in statements]
    return seen, bootstrap_interval(value, docs, resamples=resamples, seed=0)


def resamples_reaching(rule, statements: list[dict], target: float, resamples: int = 2000) -> tuple:
    """How often the rule's ROC AUC reaches target over bootstrap resamples of whole documents, with that 95%
    interval: (share, low, high)."""
    values = [rule(s) for s in statements]
    seen, (low, high) = document_resamples(
        statements, lambda labels, idx: roc_auc(labels, [values[i] for i in idx]), resamples
    )
    return sum(a >= target for a in seen) / len(seen), low, high


TYPES = ("number", "date", "name", "place", "negation", "antonym", "role")


def tables(report: dict, counts: dict) -> str:
    """Markdown: each perturbation part (pairwise accuracy and the share of perturbed copies caught, per type; the
    share of paraphrase controls and originals that pass), then the labelled data."""
    out = []
    for part, role in (("summeval", "where the rule was chosen"), ("frank", "held out")):
        n = ", ".join(f"{t} {counts.get(f'{t}/{part}', 0)}" for t in TYPES)
        out += [f"\n## Perturbations, {part} part ({role}; pairs: {n})\n"]
        out += ["pairwise accuracy (original above perturbed) / share of perturbed copies called unsupported\n"]
        out += ["| rule | " + " | ".join(TYPES) + " | paraphrases pass | originals pass |", "|---|" + "---|" * 9]
        for name, f in report.items():
            cells = [f"{f[f'{part} {t}']:.2f} / {f[f'{part} {t} caught']:.2f}" for t in TYPES if f"{part} {t}" in f]
            mark = " (chosen)" if name == CHOSEN else ""
            out.append(
                f"| {name}{mark} | " + " | ".join(cells) + f" | {f[f'{part} paraphrase pass']:.2f} | "
                f"{f[f'{part} original pass']:.2f} |"
            )
    columns = ["FRANK bbc AUC", "FRANK cnndm AUC", "SummEval Spearman", "SummEval other 48", "REALSumm BA"]
    out += ["\n## Labelled data\n", "| rule | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, f in report.items():
        out.append(
            f"| {name}{' (chosen)' if name == CHOSEN else ''} | "
            + " | ".join("-" if f[c] is None else f"{f[c]:.3f}" for c in columns)
            + " |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    perturbations, frank = load("perturbations"), load("frank")
    summeval, realsumm = load("summeval"), load("realsumm")
    # The 48 SummEval documents the development pick leaves out, profiled by research/likelihood_prompts.py under
    # each instruction the product asks with: no rule was chosen on them. "-" where they have not been profiled.
    rest = [
        read_profiles(RUNS / "likelihood_prompts" / n / "token_profiles_summeval_rest.json")
        for n in ("quote", "summary")
    ]
    summeval_rest = as_product(*rest) if all(rest) else []
    for rule in OWN_THRESHOLD:
        rule.threshold = fit_threshold(rule, frank)
    report = {}
    for name, rule in RULES.items():
        figures = dataset_figures(rule, frank, summeval, summeval_rest, realsumm)
        report[name] = {**perturbation_figures(rule, perturbations), **figures, "threshold": threshold_of(rule)}
    counts = json.loads((HERE / "data" / "perturbations.counts.json").read_text())["counts"]
    text = tables(report, counts)
    for part, target in FRANK_TARGETS.items():
        mine = [s for s in frank if s["part"] == part]
        share, low, high = resamples_reaching(RULES[CHOSEN], mine, target)
        faithful, wrong = sum(not s["error"] for s in mine), sum(s["error"] for s in mine)
        text += (
            f"\nFRANK {part} ({faithful} faithful sentences, {wrong} wrong): under the chosen rule, {share:.0%} of"
            f" 2,000 bootstrap resamples of its documents reach ROC AUC {target} (issue 29's target);"
            f" 95% lie in [{low:.3f}, {high:.3f}].\n"
        )
    (HERE / "results" / "verdict_rules.json").write_text(json.dumps(report, indent=1) + "\n")
    (HERE / "results" / "verdict_rules.md").write_text("# Likelihood verdict rules\n" + HEADER + text)
    print(text)


HEADER = """
`python -m research.token_profiles` (the embedded judge's profiles of every statement, about 7 minutes on 2 cores),
then `python -m research.verdict_rules` (seconds, no model). Perturbation set: `python -m research.perturbations --seed
0` (634 pairs). Labelled data: FRANK sentences (ROC AUC of P(yes) against "no error", per collection), SummEval dev
10 documents (Spearman of a summary's mean P(yes) with expert consistency), REALSumm key facts (balanced accuracy).

How the rule was chosen, as it happened: the "typed conflict" rules were compared on the SummEval part of the
perturbation set, where a weight of 1 caught most changed facts with 96% of paraphrases passing; on the labelled
data they lowered FRANK CNN/DM (0.844 -> 0.787) and SummEval (0.469 -> 0.443). Reading why (a pronoun where the
source names someone, a word where it writes a number: paraphrases, counted as conflicts), the conflict was
narrowed to a swap of the same kind, and the weight halved; that choice was made after seeing the labelled data,
so its figures there are not held out. The FRANK part of the perturbation set was printed beside the SummEval part
while comparing; no setting was picked by it, but it was seen.
Later, reading the faithful CNN/DM and SummEval sentences that the rule still penalised: a negation counted as a
swap when both sides were one ("n't" where the judge expected "not"; a tokenized "did n't" read as the word "n").
A swap of negations now needs the sense to flip (one side a negation, the other not), with the contraction the
tokenizer cut joined back on (scorers/stages/likelihood.written_token). That mended CNN/DM 0.835 -> 0.841 and SummEval
0.451 -> 0.463, and moved no perturbation figure; it was a bug, found on the labelled data.

"SummEval other 48": the 48 SummEval documents of the file that the 10-document development pick leaves out,
profiled by research/likelihood_prompts.py; no rule above was chosen on them. The "(own threshold)" rules were
added after everything above, to ask why BBC/XSum (abstractive) ranks worst: the mean PMI grows with how rare a
statement's words are, so a faithful paraphrase in plain words scores low. The share of the statement's surprisal
(without the text) that the text explains does not: it ranks BBC/XSum 0.736 and the 48 held-out documents 0.408,
and puts every original above its changed copy, but loses CNN/DM (0.806) and, at its own threshold, catches almost
no changed copy (one changed word moves the share little). Its weight beside the mean (2) was the first tried and
the best on SummEval dev of 2, 4, 6 and 8 (more weight: BBC/XSum up to 0.721, CNN/DM down to 0.833). None of these
is the product's rule: they are not in nats (each gets the threshold with the best balanced accuracy on FRANK's
sentences, as 2.0 was set, and its perturbation columns use it), and no rule here reaches both FRANK targets.
The last five "(own threshold)" rows came after that, each for a reason to rank an abstractive sentence better than
the mean does (tokens the text makes likelier, whatever their size; no single token dominating; only the tokens that
carry content; a spread that betrays one bad span; words the source never writes, a lexical check). Each moves
BBC/XSum and CNN/DM in opposite directions or loses both, so none was taken. The two FRANK collections are small
(the lines under the tables): over bootstrap resamples of documents the chosen rule's BBC/XSum AUC has a standard
deviation of 0.065 (41 documents), and CNN/DM's rests on 6 wrong sentences.
Its mean-PMI row reproduces the product's figures before the change (FRANK BBC 0.689, SummEval 0.469, REALSumm
0.651; CNN/DM 0.844 here against 0.839 in the product, which splits some sentences into two claims).
Since then the product asks a summary of one sentence as the judge's one-sentence summary of the source ("Summarize
the article in one sentence.") and every other statement as a quote (research/likelihood_prompts.py says why). The
FRANK and SummEval profiles here are taken that way: 138 of BBC/XSum's 140 summaries are one sentence, none of
CNN/DM's, 6 of SummEval dev's 120 and 21 of the other 48 documents' 576. The perturbation set's sentences are asked
as claims of a longer summary (quotes), REALSumm's key facts as coverage statements (quotes), so those columns did
not move. Every figure quoted in the paragraphs above was measured before, with every statement asked as a quote
(the chosen rule: BBC/XSum 0.688 then, 0.737 now; CNN/DM 0.841 both; SummEval 0.463 -> 0.460; the other 48
0.371 -> 0.368).
"""

if __name__ == "__main__":
    main()
