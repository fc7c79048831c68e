"""`sumscore compare` on SummEval: does our judge's verdict on a pair of systems agree with the experts'?

    python -m benchmarks.compare_systems --data DATA/summeval_dev.jsonl   # 58 documents x 12 systems (15 min)
    python -m benchmarks.compare_systems --data DATA/summeval_dev.jsonl --documents 10   # a quicker look

1. Scores every SummEval summary once with the embedded judge (`sumscore score`, resumable), then splits the rows
   into one OUTPUT per system (runs/summeval_compare/systems/M8.jsonl, ...).
2. Runs `sumscore compare` on two systems, writing the terminal table, the HTML page (and a screenshot of it when
   chromium is installed) and the JSON to results/compare_summeval_<A>_<B>.*.
3. Treats the experts' SummEval ratings as a third "judge" (rows with score = mean of consistency and relevance
   rescaled to 0..1, alignment = consistency, coverage = relevance) and compares all 12 systems under each, with
   the same statistics (paired bootstrap, permutation test, Holm over the 66 pairs): how often our judge's pairwise
   verdict (A better, B better, no difference) matches the experts', and how the two rankings correlate.
Writes results/compare_summeval_agreement.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from offline_sumscore.analysis.comparison import compare_systems, system_from_rows
from offline_sumscore.io.outputs import read_results, write_rows

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
AXES = {
    "score": "experts' (consistency + relevance) / 2",
    "alignment": "experts' consistency",
    "coverage": "experts' relevance",
}


def expert_rows(items: list[dict]) -> dict[str, list[dict]]:
    """One row per summary, per system, holding the experts' ratings (1..5) rescaled to 0..1."""
    by_system: dict[str, list[dict]] = {}
    for item in items:
        human = item["human"]
        consistency, relevance = (human["consistency"] - 1) / 4, (human["relevance"] - 1) / 4
        by_system.setdefault(item["system"], []).append(
            {
                "id": item["id"],
                "doc_id": item["doc_id"],
                "metric": "two-axis",
                "score": (consistency + relevance) / 2,
                "alignment": consistency,
                "coverage": relevance,
                "judge": {"name": "SummEval experts (3 raters, mean)"},
                "settings": {},
            }
        )
    return by_system


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        k = 0
        while k < len(order):
            j = k
            while j + 1 < len(order) and values[order[j + 1]] == values[order[k]]:
                j += 1
            for m in range(k, j + 1):
                out[order[m]] = (k + j) / 2
            k = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / ((sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="SummEval's agreement file (summeval_dev.jsonl)")
    ap.add_argument("--documents", type=int, default=None, help="the first N documents (default: all)")
    ap.add_argument("--pair", default="M8,M23", help="the two systems shown with `sumscore compare`")
    ap.add_argument("--resamples", type=int, default=10000)
    args = ap.parse_args()
    items = [json.loads(line) for line in args.data.open()]
    docs = sorted({i["doc_id"] for i in items})[: args.documents] if args.documents else None
    if docs is not None:
        items = [i for i in items if i["doc_id"] in set(docs)]
    run, ours = score_systems(items, docs)
    sumscore = [sys.executable, "-m", "offline_sumscore"]
    show_pair(run, sumscore, args.pair, args.resamples)
    judge_against_experts(ours, items, docs, args.resamples)


def score_systems(items: list[dict], docs: list | None) -> tuple[Path, dict[str, list[dict]]]:
    """1. Every summary scored once with `sumscore score` (resumable), its rows split by system."""
    run = HERE / "results" / "runs" / f"summeval_compare{'' if docs is None else f'_{len(docs)}docs'}"
    run.mkdir(parents=True, exist_ok=True)
    inputs = run / "input.jsonl"
    inputs.write_text(
        "".join(json.dumps({k: i[k] for k in ("id", "doc_id", "source", "summary")}) + "\n" for i in items)
    )
    scores = run / "scores.jsonl"
    sumscore = [sys.executable, "-m", "offline_sumscore"]
    subprocess.run([*sumscore, "score", str(inputs), "-o", str(scores), "--resume", "--quiet"], check=True)
    system_of = {i["id"]: i["system"] for i in items}
    ours: dict[str, list[dict]] = {}
    for row in read_results(scores):
        ours.setdefault(system_of[row["id"]], []).append(row)
    (run / "systems").mkdir(exist_ok=True)
    for system, rows in ours.items():
        write_rows(rows, run / "systems" / f"{system}.jsonl")
    return run, ours


def show_pair(run: Path, sumscore: list[str], pair: str, resamples: int) -> None:
    """2. The command itself on one pair: its table, its page, and a screenshot of the page where chromium is."""
    a, b = pair.split(",")
    stem = RESULTS / f"compare_summeval_{a}_{b}"
    shown = subprocess.run(
        [
            *sumscore,
            "compare",
            str(run / "systems" / f"{a}.jsonl"),
            str(run / "systems" / f"{b}.jsonl"),
            "--by",
            "doc_id",
            "-o",
            f"{stem}.html",
            "--json",
            f"{stem}.json",
            "--resamples",
            str(resamples),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    Path(f"{stem}.txt").write_text(shown)
    print(shown)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1200,1500",
                f"--screenshot={stem}.png",
                Path(f"{stem}.html").as_uri(),
            ],
            capture_output=True,
            timeout=120,
        )


def judge_against_experts(ours: dict[str, list[dict]], items: list[dict], docs: list | None, resamples: int) -> None:
    """3. Our judge against the experts, every pair of systems, with the same statistics."""
    names = sorted(ours)
    judge = compare_systems(
        [system_from_rows(n, ours[n], by="doc_id") for n in names],
        resamples=resamples,
        fields=("score", "alignment", "coverage"),
    )
    experts_by_system = expert_rows(items)
    experts = compare_systems(
        [system_from_rows(n, experts_by_system[n], by="doc_id") for n in names],
        resamples=resamples,
        fields=("score", "alignment", "coverage"),
    )
    summary, table = verdict_agreement(judge, experts, names)
    ranking = ["| rank | our judge (mean score) | experts (mean of consistency and relevance, 0..1) |", "|---|---|---|"]
    for k, (mine, theirs) in enumerate(zip(judge["ranking"], experts["ranking"]), 1):
        ranking.append(
            f"| {k} | {mine} {judge['means'][mine]['score']['mean']:.3f} | "
            f"{theirs} {experts['means'][theirs]['score']['mean']:.3f} |"
        )
    significant = "; ".join(
        f"{f}: experts {s['experts_significant']}, our judge {s['judge_significant']}" for f, s in summary.items()
    )
    markdown = (
        f"# Our judge's pairwise verdicts against the SummEval experts'\n\n{judge['documents']} documents x "
        f"{len(names)} systems ({len(judge['pairs'])} pairs), judge {ours[names[0]][0]['judge']['name']} at "
        f"its default design; verdicts from the paired permutation test, Holm-adjusted over the pairs, "
        f"alpha 0.05 ({resamples} resamples, seed 0). Pairs with a verdict other than 'no difference': "
        f"{significant}.\n\n" + "\n".join(table) + "\n\n" + "\n".join(ranking) + "\n\n"
        f"`python -m benchmarks.compare_systems{'' if docs is None else f' --documents {len(docs)}'}`\n"
    )
    out = RESULTS / "compare_summeval_agreement"
    Path(f"{out}.md").write_text(markdown)
    Path(f"{out}.json").write_text(json.dumps(agreement_json(summary, judge, experts), indent=1) + "\n")
    print(markdown)


def verdict_agreement(judge: dict, experts: dict, names: list[str]) -> tuple[dict, list[str]]:
    """Per field: how often our judge's pairwise verdict is the experts', and the Spearman of system means."""
    table = [
        "| our field | experts' field | pairs | same verdict | both 'no difference' | opposite verdicts | "
        "Spearman of system means |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for field, theirs in AXES.items():
        pairs = list(zip(judge["pairs"], experts["pairs"]))
        same = sum(p["fields"][field]["verdict"] == q["fields"][field]["verdict"] for p, q in pairs)
        both_none = sum(
            p["fields"][field]["verdict"] == q["fields"][field]["verdict"] == "no difference" for p, q in pairs
        )
        opposite = sum({p["fields"][field]["verdict"], q["fields"][field]["verdict"]} == {"A", "B"} for p, q in pairs)
        rho = spearman(
            [judge["means"][n][field]["mean"] for n in names], [experts["means"][n][field]["mean"] for n in names]
        )
        summary[field] = {
            "pairs": len(pairs),
            "same_verdict": same,
            "both_no_difference": both_none,
            "opposite": opposite,
            "spearman_system_means": rho,
            "experts_significant": sum(q["fields"][field]["verdict"] != "no difference" for _, q in pairs),
            "judge_significant": sum(p["fields"][field]["verdict"] != "no difference" for p, _ in pairs),
        }
        table.append(
            f"| {field} | {theirs} | {len(pairs)} | {same} ({100 * same / len(pairs):.0f}%) | {both_none} | "
            f"{opposite} | {rho:+.2f} |"
        )
    return summary, table


def agreement_json(summary: dict, judge: dict, experts: dict) -> dict:
    return {
        "summary": summary,
        "judge_ranking": judge["ranking"],
        "experts_ranking": experts["ranking"],
        "judge_means": judge["means"],
        "experts_means": experts["means"],
        "pairs": [
            {
                "a": p["a"],
                "b": p["b"],
                "judge": {f: p["fields"][f]["verdict"] for f in AXES},
                "experts": {f: q["fields"][f]["verdict"] for f in AXES},
            }
            for p, q in zip(judge["pairs"], experts["pairs"])
        ],
    }


if __name__ == "__main__":
    main()
