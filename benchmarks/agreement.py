"""Agreement benchmark: how closely the local judge tracks human raters and recorded hosted judges.

    python -m benchmarks.agreement --data DATA/frank_finesure_gpt4o.jsonl    # all 66 documents
    python -m benchmarks.agreement --data DATA/summeval_dev.jsonl --documents 10 --metric both
    python -m benchmarks.agreement --data DATA/realsumm_keyfacts.jsonl             # all 105 items
    python -m benchmarks.agreement --data FILE --model /models/Qwen2.5-7B-Instruct --metric both   # all items

Input: JSONL, one object per (document, summary) item: `id`, `source`, `summary`, `human` (name -> number, or the
lists named below), `judges` (judge -> name -> number), and optionally `doc_id` (else the middle of an id shaped
`<set>:<doc>:<system>`, else the id). Three kinds of file are recognised by their fields:
  scores    (SummEval and any file of numeric scores): correlations of our scores with every human score and every
            hosted judge's score, dataset level and summary level, with bootstrap intervals over documents;
  sentences (FRANK: `sentences`, human.sentence_error_majority): where the scorer's claims are the summary's
            sentences, the whole summary is scored, as the product scores it, and each FRANK sentence takes the
            claims that lie in it (or the one that holds it, where FRANK split inside a quote); with atomic claims,
            each sentence is judged as its own summary. Our sentence verdict is "every claim supported"; balanced
            accuracy and kappa at sentence and summary level against humans and against the hosted judge;
  keyfacts  (REALSumm: `keyfacts`, human.keyfact_present_majority): the key facts are given to the scorer as
            key_facts (statements checked against the summary, FineSurE-style), so our verdict per fact is "the
            summary supports it"; balanced accuracy and kappa per fact, and correlations of coverage with human
            completeness.
Balanced accuracy and ROC AUC carry 95% bootstrap intervals that resample whole documents, as the correlations do.
The hosted judges' own agreement with humans on the same items is computed from the file and shown beside ours.

Scoring goes through the same bulk run as `sumscore score` (offline_sumscore.runs.bulk.run_bulk): the rows land in
benchmarks/results/runs/<name>/scores.jsonl, resumable, with the stage cache; a rerun only recomputes statistics
(and says how many rows it resumed); after a change to the product, --fresh scores every row again.
Writes benchmarks/results/agreement_<data>_<metric>_<judge>.{md,json} and PNG plots beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.agreement_items import kind_of, pick_documents, read_items
from benchmarks.lib.agreement_stats import balanced_accuracy, binary_agreement, correlate, roc_auc, with_interval
from offline_sumscore.core.errors import InputError
from offline_sumscore.engine.judge import default_judge

RESULTS = Path(__file__).resolve().parent / "results"
OURS = {
    "two-axis": ["score", "alignment", "coverage", "soft_alignment", "soft_coverage"],
    "summary-score": ["score", "qa", "conciseness", "soft_qa"],
}
# Which human dimension each of our measures is meant to track (scores files); the rest of the matrix is in JSON.
PRIMARY = {
    "alignment": "consistency",
    "soft_alignment": "consistency",
    "coverage": "relevance",
    "soft_coverage": "relevance",
    "score": "mean",
    "qa": "relevance",
    "soft_qa": "relevance",
    "conciseness": "relevance",
}


# -- scoring: the bulk run, one row per item (per sentence for FRANK with atomic claims) -----------------------
def scoring_rows(items: list[dict], kind: str, whole_summaries: bool = True):
    """whole_summaries (kind "sentences"): one row per summary, whose claims are its sentences; else one row per
    sentence (atomic claims cannot be told apart by sentence)."""
    from offline_sumscore.core.samples import Sample, judged_hash

    for item in items:
        if kind == "sentences":
            # Sentence rows need no coverage (only alignment is compared): an empty key-fact list skips it.
            units = [(f"{item['id']}#s{k}", sentence, ()) for k, sentence in enumerate(item["sentences"])]
            if whole_summaries:
                units = [(item["id"], item["summary"], ())]
        elif kind == "keyfacts":
            units = [(item["id"], item["summary"], tuple(item["keyfacts"]))]
        else:
            units = [(item["id"], item["summary"], None)]
        for row_id, summary, key_facts in units:
            yield Sample(
                id=row_id,
                source=item["source"],
                summary=summary,
                key_facts=key_facts,
                line=item["_line"],
                key=f"id:{row_id}",
                input_hash=judged_hash(item["source"], summary, None, key_facts),
                given_id=row_id,
            )


def score(items, kind, metric, args, run_dir: Path) -> tuple[dict[str, dict], dict]:
    from offline_sumscore import SummarizationScorer, SummaryScore, load_judge
    from offline_sumscore.engine.stage_cache import StageCache, default_cache_path
    from offline_sumscore.runs.bulk import run_bulk

    judge = load_judge(args.model, device=args.device)
    cache = None if args.no_cache else StageCache(args.cache or default_cache_path())
    cls = SummarizationScorer if metric == "two-axis" else SummaryScore
    options = {
        k: v
        for k, v in (("max_questions", args.max_questions), ("max_claims", args.max_claims))
        if v is not None and (k != "max_claims" or metric == "two-axis")
    }
    if metric == "two-axis":
        options.update(
            {k: v for k, v in (("claims", args.claims), ("coverage", args.coverage), ("verdicts", args.verdicts)) if v}
        )
        if args.no_reason:
            options["include_reason"] = False
    if kind == "keyfacts" and metric == "two-axis":
        options["max_questions"] = max(len(i["keyfacts"]) for i in items)  # every key fact is asked
    scorer = cls(judge, cache=cache, batch_size=args.batch_size, **options)
    # A sentence asked alone is a one-sentence summary, which a likelihood verdict asks differently from a sentence
    # of a longer one: score whole summaries where the claims are their sentences.
    whole = kind == "sentences" and metric == "two-axis" and scorer.design["claims"] == "sentences"
    rows = list(scoring_rows(items, kind, whole_summaries=whole))
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.fresh:  # rows kept from an earlier run were scored by the code of that run
        for kept in ("scores.jsonl", "cost.json"):
            (run_dir / kept).unlink(missing_ok=True)
    started = time.perf_counter()
    report = run_bulk(rows, scorer, run_dir / "scores.jsonl", resume=True)
    seconds = time.perf_counter() - started
    if report.resumed:
        print(
            f"{report.resumed} of {len(rows)} rows resumed from {run_dir / 'scores.jsonl'}, as an earlier run scored "
            "them: pass --fresh to score them with the code as it is now",
            file=sys.stderr,
        )
    stages = [s for r in report.rows for s in r.get("stages", {}).values()]
    stacked = scorer.stacked_engine
    cost = {
        "seconds": round(seconds, 1),
        "rows": len(rows),
        "rows_scored_now": len(rows) - report.resumed,
        "rows_per_s": round((len(rows) - report.resumed) / seconds, 4)
        if seconds and report.resumed < len(rows)
        else None,
        "tokens_in": sum(s["tokens_in"] for s in stages),
        "tokens_out": sum(s["tokens_out"] for s in stages),
        # Without a cache every stage request reached the judge.
        "stage_requests_computed": getattr(stacked, "computed", len(stages)),
        "stage_requests_cached": getattr(stacked, "hits", 0),
        "failed_rows": sum(1 for r in report.rows if r.get("error")),
        "judge": judge.describe(),
        "settings": scorer.settings,
    }
    # The cost of scoring is the run that scored the rows: kept beside them, so a rerun that only recomputes the
    # statistics still reports it.
    recorded = run_dir / "cost.json"
    if cost["rows_scored_now"] == len(rows) and not report.resumed:
        recorded.write_text(
            json.dumps(
                {
                    k: cost[k]
                    for k in ("seconds", "rows", "rows_per_s", "tokens_in", "tokens_out", "stage_requests_computed")
                }
            )
            + "\n"
        )
    if recorded.exists():
        cost["scoring_run"] = json.loads(recorded.read_text())
    return {r["id"]: r for r in report.rows}, cost


# -- statistics per kind --------------------------------------------------------------------------------------------
def numeric_fields(d: dict) -> dict[str, float]:
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def scores_report(items, rows, metric, args) -> dict:
    docs = [i["doc_id"] for i in items]
    ours = {m: [rows.get(i["id"], {}).get(m) for i in items] for m in OURS[metric]}
    human_names = sorted({k for i in items for k in numeric_fields(i["human"])})
    humans = {h: [numeric_fields(i["human"]).get(h) for i in items] for h in human_names}
    if human_names:
        humans["mean"] = [
            sum(v for v in (humans[h][n] for h in human_names) if v is not None) / len(human_names)
            if all(humans[h][n] is not None for h in human_names)
            else None
            for n in range(len(items))
        ]
    judges = {}
    for i in items:
        for judge, fields in i["judges"].items():
            for name in numeric_fields(fields) if isinstance(fields, dict) else {}:
                judges.setdefault(f"{judge}:{name}", None)
    hosted = {
        j: [numeric_fields(i["judges"].get(j.split(":")[0], {}) or {}).get(j.split(":")[1]) for i in items]
        for j in judges
    }

    def corr(x, y, shown):
        # Intervals for the pairs the table shows; the rest of the matrix (in the JSON) gets point values only.
        return correlate(x, y, docs, resamples=args.resamples if shown else 0, seed=args.seed)

    out: dict[str, Any] = {"ours_vs_human": {}, "ours_vs_hosted": {}, "hosted_vs_human": {}}
    for m, xs in ours.items():
        for h, ys in humans.items():
            out["ours_vs_human"][f"{m}~{h}"] = corr(xs, ys, PRIMARY.get(m) == h)
        for j, ys in hosted.items():
            out["ours_vs_hosted"][f"{m}~{j}"] = corr(
                xs, ys, j.startswith("gpt-4") and j.endswith(f":{PRIMARY.get(m)}_rts")
            )
    for j, xs in hosted.items():
        dim = j.split(":")[1].split("_")[0]
        if dim in humans:
            out["hosted_vs_human"][f"{j}~{dim}"] = corr(xs, humans[dim], j.endswith("_rts"))
    out["constant"] = {
        m: sorted({v for v in xs if v is not None})[0]
        for m, xs in ours.items()
        if len({v for v in xs if v is not None}) == 1
    }
    out["_series"] = {"ours": ours, "humans": humans, "hosted": hosted}
    return out


def compare_binary(human, ours, hosted, docs, args, *, on_hosted_items: bool = True) -> dict:
    """Our verdicts against the humans' and the hosted judge's, and the hosted judge against the humans, on the
    items the hosted judge labelled (optionally ours against the humans on those items too). Ours against the
    humans carries a bootstrap interval over documents."""
    both = [n for n in range(len(human)) if hosted[n] is not None]

    def pick(values):
        return [values[n] for n in both]

    mine = binary_agreement(human, ours)
    mine["balanced_accuracy_ci"] = with_interval(
        balanced_accuracy, human, ours, docs, resamples=args.resamples, seed=args.seed
    )["ci"]
    out = {"ours_vs_human": mine, "ours_vs_hosted": binary_agreement(pick(hosted), pick(ours))}
    if on_hosted_items:
        out["ours_vs_human_on_hosted_items"] = binary_agreement(pick(human), pick(ours))
    out["hosted_vs_human"] = binary_agreement(pick(human), pick(hosted))
    return out


def sentence_rows(item: dict, rows: dict[str, dict]) -> list[dict]:
    """Per FRANK sentence, a row of its own: alignment, soft_alignment and claims (or error), as a row per sentence
    has them. From a whole summary's row, each sentence takes the claims that lie in it, or the claim that holds it
    (FRANK split two summaries inside a quote, where the product does not); raises if a sentence has none."""
    whole = rows.get(item["id"])
    if whole is None:
        return [rows.get(f"{item['id']}#s{k}") or {} for k in range(len(item["sentences"]))]
    if whole.get("error"):
        return [whole] * len(item["sentences"])

    def flat(text: str) -> str:
        return " ".join(text.split())

    out = []
    for k, sentence in enumerate(item["sentences"]):
        mine = [c for c in whole["claims"] if flat(c["claim"]) in flat(sentence) or flat(sentence) in flat(c["claim"])]
        if not mine:
            raise ValueError(f"{item['id']}: no claim lies in FRANK's sentence {k}: {sentence!r}")
        p = [c["p_supported"] for c in mine]
        out.append(
            {
                "alignment": sum(c["supported"] for c in mine) / len(mine),
                "soft_alignment": None if None in p else sum(p) / len(p),
                "claims": mine,
            }
        )
    return out


def sentences_report(items, rows, args) -> dict:
    human_s, judge_s, ours_s, p_s, docs_s, parts_s = [], [], [], [], [], []
    human_sum, judge_sum, ours_sum, p_sum = [], [], [], []
    ours_faith, human_faith = [], []
    judge_name = next((j for i in items for j in i["judges"]), None)
    for item in items:
        labels = item["human"]["sentence_error_majority"]
        verdict = (item["judges"].get(judge_name) or {}) if judge_name else {}
        theirs = verdict.get("sentence_error")
        mine, mine_p, weakest = [], [], []
        for row in sentence_rows(item, rows):
            mine.append(None if row.get("error") or row.get("alignment") is None else row["alignment"] < 1)
            mine_p.append(row.get("soft_alignment"))
            weakest += [c.get("p_supported") for c in row.get("claims") or []] or [None]
        for k, label in enumerate(labels):
            human_s.append(bool(label))
            ours_s.append(mine[k] if k < len(mine) else None)
            p_s.append(mine_p[k] if k < len(mine_p) else None)
            judge_s.append(bool(theirs[k]) if theirs and k < len(theirs) else None)
            docs_s.append(item["doc_id"])
            parts_s.append(item.get("dataset_part"))
        # A summary is as supported as its weakest claim: the soft summary-level verdict is the minimum P(yes).
        p_sum.append(None if not weakest or any(p is None for p in weakest) else min(weakest))
        human_sum.append(bool(item["human"]["summary_has_error"]))
        judge_sum.append(bool(verdict["summary_has_error"]) if "summary_has_error" in verdict else None)
        ours_sum.append(None if any(m is None for m in mine) else any(mine))
        human_faith.append(item["human"].get("faithfulness"))
        ours_faith.append(None if any(m is None for m in mine) or not mine else 1 - sum(mine) / len(mine))
    docs = [i["doc_id"] for i in items]

    def auc(truth, scores, where):
        return with_interval(roc_auc, truth, scores, where, resamples=args.resamples, seed=args.seed)

    return {
        "hosted_judge": judge_name,
        "sentence": compare_binary(human_s, ours_s, judge_s, docs_s, args),
        "summary": compare_binary(human_sum, ours_sum, judge_sum, docs, args, on_hosted_items=False),
        "soft": {
            "sentence: auc_p_supported_vs_human_no_error": auc([not h for h in human_s], p_s, docs_s),
            "summary: auc_min_p_supported_vs_human_no_error": auc([not h for h in human_sum], p_sum, docs),
            # Per source collection: FRANK mixes abstractive XSum summaries (mostly wrong) with near-
            # extractive CNN/DM ones (mostly right), so a judge that rewards copying scores well on the mix.
            **{
                f"sentence, {part} only: auc_p_supported_vs_human_no_error": auc(
                    [not h for h, q in zip(human_s, parts_s) if q == part],
                    [p for p, q in zip(p_s, parts_s) if q == part],
                    [d for d, q in zip(docs_s, parts_s) if q == part],
                )
                for part in sorted({q for q in parts_s if q})
            },
        },
        "faithfulness": correlate(ours_faith, human_faith, docs, resamples=0),
        "_series": {
            "p_supported": p_s,
            "human_no_error": [not h for h in human_s],
            "ours_faith": ours_faith,
            "human_faith": human_faith,
        },
    }


def keyfacts_report(items, rows, args) -> dict:
    judge_name = next((j for i in items for j in i["judges"]), None)
    human_k, ours_k, judge_k, p_k, docs_k = [], [], [], [], []
    cov, comp, gpt_comp = [], [], []
    for item in items:
        row = rows.get(item["id"]) or {}
        verdicts = [] if row.get("error") else row.get("coverage_verdicts", [])
        theirs = (item["judges"].get(judge_name) or {}).get("keyfact_present") if judge_name else None
        for k, label in enumerate(item["human"]["keyfact_present_majority"]):
            human_k.append(bool(label))
            ours_k.append(verdicts[k]["answered"] if k < len(verdicts) else None)
            p_k.append(verdicts[k].get("p_answered") if k < len(verdicts) else None)
            judge_k.append(bool(theirs[k]) if theirs and k < len(theirs) else None)
            docs_k.append(item["doc_id"])
        cov.append(row.get("coverage"))
        comp.append(item["human"].get("completeness"))
        gpt_comp.append((item["judges"].get(judge_name) or {}).get("completeness") if judge_name else None)
    docs = [i["doc_id"] for i in items]
    return {
        "hosted_judge": judge_name,
        "keyfact": compare_binary(human_k, ours_k, judge_k, docs_k, args),
        "soft": {
            "keyfact: auc_p_answered_vs_human_present": with_interval(
                roc_auc, human_k, p_k, docs_k, resamples=args.resamples, seed=args.seed
            )
        },
        "completeness": {
            "ours_vs_human": correlate(cov, comp, docs, resamples=args.resamples, seed=args.seed),
            "hosted_vs_human": correlate(gpt_comp, comp, docs, resamples=args.resamples, seed=args.seed),
        },
        "_series": {"p_answered": p_k, "human_present": human_k, "coverage": cov, "completeness": comp},
    }


# -- output -----------------------------------------------------------------------------------------------------
def fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_corr(c: dict, level: str, name: str) -> str:
    s = c[level][name]
    ci = f" [{fmt(s['ci'][0], 2)}, {fmt(s['ci'][1], 2)}]" if s.get("ci") else ""
    docs = f" ({s['documents_defined']} docs)" if level == "summary" else ""
    return f"{fmt(s['value'])}{ci}{docs}"


def _cost_line(cost: dict) -> str:
    run = cost.get("scoring_run")
    if run:
        return (
            f"{run['seconds']} s to score {run['rows']} rows from scratch ({run['rows_per_s']} rows/s, "
            f"{run['stage_requests_computed']} stage requests computed), on {cost['judge']['device']}."
        )
    return (
        f"{cost['seconds']} s in this run, {cost['rows_scored_now']} rows scored now (the rest resumed or "
        f"cached), on {cost['judge']['device']}."
    )


def markdown(report: dict) -> str:
    head = report["header"]
    lines = [
        f"# Agreement: {head['data']}, metric {head['metric']}, judge {head['judge']}",
        "",
        f"{head['items']} items from {head['documents']} documents ({head['selection']}); scored rows "
        f"{head['cost']['rows']}, failed {head['cost']['failed_rows']}; {head['cost']['tokens_in']} tokens in, "
        f"{head['cost']['tokens_out']} tokens out. Cost: " + _cost_line(head["cost"]),
        "",
    ]
    kind = head["kind"]
    if kind == "scores":
        r = report["stats"]
        constant = "; ".join(
            f"{m} is {v} on every item, so its correlations are undefined (-)" for m, v in r.get("constant", {}).items()
        )
        lines += [
            "Spearman / Kendall tau-b / Pearson with 95% bootstrap intervals over documents. Dataset level: "
            "over all items; summary level: within each document, averaged over the documents where it is "
            "defined (a document whose scores are all tied has none)." + (f" Note: {constant}." if constant else ""),
            "",
            "| ours | against | Spearman (dataset) | Kendall (dataset) | Pearson (dataset) | Spearman (summary) "
            "| Kendall (summary) |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, c in r["ours_vs_human"].items():
            m, h = key.split("~")
            if PRIMARY.get(m) == h:
                lines.append(
                    f"| {m} | human {h} | {fmt_corr(c, 'dataset', 'spearman')} | "
                    f"{fmt_corr(c, 'dataset', 'kendall')} | {fmt_corr(c, 'dataset', 'pearson')} | "
                    f"{fmt_corr(c, 'summary', 'spearman')} | {fmt_corr(c, 'summary', 'kendall')} |"
                )
        for key, c in r["ours_vs_hosted"].items():
            m, j = key.split("~")
            if j.endswith(f":{PRIMARY.get(m)}_rts") and j.startswith("gpt-4"):
                lines.append(
                    f"| {m} | {j} | {fmt_corr(c, 'dataset', 'spearman')} | "
                    f"{fmt_corr(c, 'dataset', 'kendall')} | {fmt_corr(c, 'dataset', 'pearson')} | "
                    f"{fmt_corr(c, 'summary', 'spearman')} | {fmt_corr(c, 'summary', 'kendall')} |"
                )
        lines += [
            "",
            "Hosted judges against the experts on the same items (from the file):",
            "",
            "| hosted judge | against | Spearman (dataset) | Kendall (dataset) | Spearman (summary) |",
            "|---|---|---|---|---|",
        ]
        for key, c in r["hosted_vs_human"].items():
            j, h = key.split("~")
            if j.endswith("_rts"):
                lines.append(
                    f"| {j} | human {h} | {fmt_corr(c, 'dataset', 'spearman')} | "
                    f"{fmt_corr(c, 'dataset', 'kendall')} | {fmt_corr(c, 'summary', 'spearman')} |"
                )
    else:
        r = report["stats"]
        unit = "sentence" if kind == "sentences" else "keyfact"
        lines += [
            f"Binary agreement (balanced accuracy, Cohen's kappa); hosted judge: {r['hosted_judge']}.",
            "",
            "| level | comparison | n | balanced accuracy | kappa |",
            "|---|---|---|---|---|",
        ]
        for level in [unit, "summary"] if kind == "sentences" else [unit]:
            for name, b in r[level].items():
                ci = b.get("balanced_accuracy_ci")
                ci = f" [{fmt(ci[0], 2)}, {fmt(ci[1], 2)}]" if ci else ""
                lines.append(
                    f"| {level} | {name.replace('_', ' ')} | {b['n']} | {fmt(b['balanced_accuracy'])}{ci} | "
                    f"{fmt(b['kappa'])} |"
                )
        for name, value in r["soft"].items():
            level, what = name.split(": ")
            ci = f" [{fmt(value['ci'][0], 2)}, {fmt(value['ci'][1], 2)}]" if value.get("ci") else ""
            lines.append(
                f"| {level} | soft: ROC AUC of {what.replace('auc_', '').replace('_', ' ')} | {value['n']} | "
                f"{fmt(value['value'])}{ci} (AUC; 0.5 is chance) | - |"
            )
        if kind == "keyfacts":
            lines += [
                "",
                "| score | against | Spearman (dataset) | Kendall (dataset) | Pearson (dataset) |",
                "|---|---|---|---|---|",
            ]
            for name, c in r["completeness"].items():
                lines.append(
                    f"| {'our coverage' if name.startswith('ours') else 'hosted completeness'} | human "
                    f"completeness | {fmt_corr(c, 'dataset', 'spearman')} | {fmt_corr(c, 'dataset', 'kendall')} "
                    f"| {fmt_corr(c, 'dataset', 'pearson')} |"
                )
    return "\n".join(lines) + "\n"


def plots(report: dict, series: dict, stem: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, written = report["header"]["kind"], []

    def scatter(xs, ys, xlabel, ylabel, name):
        pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if not pts:
            return
        fig, ax = plt.subplots(figsize=(4.5, 4))
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, alpha=0.7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{len(pts)} summaries")
        fig.tight_layout()
        fig.savefig(f"{stem}_{name}.png", dpi=110)
        plt.close(fig)
        written.append(f"{stem.name}_{name}.png")

    def reliability(probs, truth, name, label, unit="verdicts"):
        pairs = [(p, t) for p, t in zip(probs, truth) if p is not None and t is not None]
        if not pairs:
            return
        bins = [[] for _ in range(10)]
        for p, t in pairs:
            bins[min(int(p * 10), 9)].append((p, float(t)))
        fig, ax = plt.subplots(figsize=(4.5, 4))
        ax.plot([0, 1], [0, 1], "--", color="grey", lw=1)
        xs = [sum(p for p, _ in b) / len(b) for b in bins if b]
        ys = [sum(t for _, t in b) / len(b) for b in bins if b]
        ax.plot(xs, ys, "o-")
        for x, y, b in zip(xs, ys, [b for b in bins if b]):
            ax.annotate(str(len(b)), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("judge's P(yes), binned")
        ax.set_ylabel(label)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"reliability, {len(pairs)} {unit}")
        fig.tight_layout()
        fig.savefig(f"{stem}_{name}.png", dpi=110)
        plt.close(fig)
        written.append(f"{stem.name}_{name}.png")

    if kind == "scores":
        ours, humans, hosted = series["ours"], series["humans"], series["hosted"]
        if "score" in ours and "mean" in humans:
            scatter(ours["score"], humans["mean"], "our score", "human mean of all dimensions", "vs_human")
        gpt = next((k for k in hosted if k.startswith("gpt-4") and k.endswith("consistency_rts")), None)
        if gpt and "score" in ours:
            scatter(ours["score"], hosted[gpt], "our score", gpt, "vs_gpt4")
        soft = ours.get("soft_alignment") or ours.get("soft_qa")
        if soft and "consistency" in humans:
            reliability(
                soft,
                [None if h is None else (h - 1) / 4 for h in humans["consistency"]],
                "reliability",
                "human consistency, scaled to 0..1",
                unit="summaries (mean P(yes) per summary)",
            )
    elif kind == "sentences":
        scatter(
            series["ours_faith"],
            series["human_faith"],
            "our share of sentences supported",
            "human faithfulness",
            "vs_human",
        )
        reliability(series["p_supported"], series["human_no_error"], "reliability", "share without a human error")
    else:
        scatter(
            series["coverage"],
            series["completeness"],
            "our coverage (key facts answered)",
            "human completeness",
            "vs_human",
        )
        reliability(series["p_answered"], series["human_present"], "reliability", "share present for humans")
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Agreement of the local judge with humans and hosted judges.")
    ap.add_argument("--data", type=Path, required=True, help="agreement JSONL (see the module docstring)")
    ap.add_argument(
        "--model", default=None, help="judge: model directory, .gguf or preset name (default: the default judge)"
    )
    ap.add_argument("--metric", choices=["two-axis", "summary-score", "both"], default="two-axis")
    ap.add_argument("--documents", type=int, default=None, help="a stratified subset of this many whole documents")
    ap.add_argument("--limit", type=int, default=None, help="at most this many items (whole documents)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--judged-only", action="store_true", help="only items that carry a hosted judge's output")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--cache", default=None, help="stage cache path (default as for sumscore score)")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="score every row again instead of resuming the run's rows")
    ap.add_argument("--max-questions", type=int, default=None, help="scorer option (default: the scorer's)")
    ap.add_argument("--max-claims", type=int, default=None, help="two-axis scorer option")
    ap.add_argument("--no-reason", action="store_true", help="two-axis: no reasons (far fewer tokens to decode)")
    ap.add_argument("--claims", choices=["atomic", "sentences"], default=None, help="two-axis (default: the judge's)")
    ap.add_argument(
        "--coverage", choices=["questions", "key_sentences"], default=None, help="two-axis (default: the judge's)"
    )
    ap.add_argument(
        "--verdicts", choices=["yes-no", "likelihood"], default=None, help="two-axis (default: the judge's)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        items = read_items(args.data)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = kind_of(items)
    if args.judged_only:
        items = [i for i in items if any(i["judges"].values())]
    chosen = pick_documents(items, kind, args.documents, args.limit, args.seed)
    metrics = ["two-axis", "summary-score"] if args.metric == "both" else [args.metric]
    if kind != "scores" and "summary-score" in metrics:
        print(
            f"note: {kind} files measure verdicts the two-axis metric gives; summary-score is skipped", file=sys.stderr
        )
        metrics = ["two-axis"]
    for metric in metrics:
        # Named by preset where one is given; the embedded judge keeps the name its published tables carry
        judge_name = Path(args.model or default_judge()).name.replace("smollm2-135m", "embedded")
        name = f"{args.data.stem}_{metric}_{judge_name}_" + (f"{args.documents}docs" if args.documents else "all")
        if args.max_questions or args.max_claims or args.no_reason:
            name += f"_q{args.max_questions or 'd'}c{args.max_claims or 'd'}{'_noreason' if args.no_reason else ''}"
        name += "".join(f"_{v}" for v in (args.claims, args.coverage, args.verdicts) if v)
        rows, cost = score(chosen, kind, metric, args, args.out / "runs" / name)
        if kind == "scores":
            stats = scores_report(chosen, rows, metric, args)
        elif kind == "sentences":
            stats = sentences_report(chosen, rows, args)
        else:
            stats = keyfacts_report(chosen, rows, args)
        series = stats.pop("_series")
        report = {
            "header": {
                "data": str(args.data.name),
                "kind": kind,
                "metric": metric,
                "judge": cost["judge"]["name"],
                "items": len(chosen),
                "documents": len({i["doc_id"] for i in chosen}),
                "selection": (
                    f"{args.documents} documents stratified by mean human score, seed {args.seed}"
                    if args.documents
                    else "all documents"
                )
                + (f", limit {args.limit}" if args.limit else "")
                + (", items with a hosted judge's output only" if args.judged_only else ""),
                "cost": cost,
            },
            "stats": stats,
        }
        stem = args.out / f"agreement_{name}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        report["plots"] = plots(report, series, stem)
        Path(f"{stem}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        text = markdown(report) + "\nPlots: " + ", ".join(report["plots"]) + "\n"
        Path(f"{stem}.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
