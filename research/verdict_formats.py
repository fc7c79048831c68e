"""Which way of asking gives a judge's verdicts the most signal: the measurement behind each judge's stage defaults.

    python -m research.verdict_formats                 # embedded judge, all of FRANK and REALSumm (~15 min here)
    python -m research.verdict_formats --model DIR     # a judge you bring

One verdict asks "does this text support this statement?". FRANK: each summary sentence against its source (human
label: no error). REALSumm: each human key fact against the summary (human label: present). The same verdicts are
read four ways, through the product's engine and prompts, and each is scored by ROC AUC of its P(yes) against the
human labels, with a bootstrap interval over documents:
  yes-no bare    "Is the statement fully supported by the article? Answer Yes or No." with no system message of
                 ours; P(Yes) / (P(Yes) + P(No)) from one next-token distribution
  yes-no full    the same, after the metric's system message with its principles
  json boolean   the same question, answered as {"supported": true|false}; P(true) at the boolean
  likelihood     the judge's mean log-probability per token of the statement after the text, minus the same without
                 the text (PMI); also its balanced accuracy at PMI >= 2.0 nats per token, the scorer's default
Writes research/results/verdict_formats_<judge>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from benchmarks.lib.agreement_stats import balanced_accuracy, roc_auc, with_interval
from offline_sumscore import load_judge
from offline_sumscore.core import schemas
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local import TransformersEngine
from offline_sumscore.scorers.stages.verdict import (
    LIKELIHOOD_THRESHOLD,
    likelihood_prompt,
    statement_prompt,
    yes_no_verdict,
)

RESULTS = Path(__file__).resolve().parent / "results"
DATA: Path | None = None  # the folder of the agreement files, from --data-dir
FORMATS = ("yes-no bare", "yes-no full", "json boolean", "likelihood")


class JsonVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    supported: bool


def checks(which: str) -> list[tuple[str, str, str, bool]]:
    """(document, text, statement, human yes) for every verdict of a data set."""
    items = [json.loads(line) for line in (DATA / f"{which}.jsonl").open()]
    if which.startswith("frank"):
        return [
            (i["doc_id"], i["source"], s, not e)
            for i in items
            for s, e in zip(i["sentences"], i["human"]["sentence_error_majority"])
        ]
    return [
        (i["id"], i["summary"], f, bool(p))
        for i in items
        for f, p in zip(i["keyfacts"], i["human"]["keyfact_present_majority"])
    ]


def requests(fmt: str, text: str, statement: str) -> list[StageRequest]:
    if fmt == "likelihood":
        return [
            StageRequest(
                "t", "support", tuple(likelihood_prompt(text, style="bare")), schemas.Likelihood, continuation=statement
            ),
            StageRequest(
                "b", "baseline", tuple(likelihood_prompt("", style="bare")), schemas.Likelihood, continuation=statement
            ),
        ]
    style = "full" if fmt == "yes-no full" else "bare"
    messages = statement_prompt(text, statement, style=style)
    if fmt == "json boolean":
        messages[-1] = dict(
            messages[-1],
            content=messages[-1]["content"].replace(
                "Answer Yes or No.", 'Reply with JSON: {"supported": true} or {"supported": false}.'
            ),
        )
        return [StageRequest("t", "support", tuple(messages), JsonVerdict, verdict_choice=("t", "f"))]
    return [StageRequest("t", "support", tuple(messages), yes_no_verdict(None), verdict_choice=("Y", "N"))]


def measure(engine: TransformersEngine, which: str, fmt: str) -> dict:
    rows = checks(which)
    started = time.perf_counter()
    width = 2 if fmt == "likelihood" else 1
    reqs = [r for _, text, statement, _ in rows for r in requests(fmt, text, statement)]
    out = []
    for at in range(0, len(reqs), 64 * width):  # waves of 64 verdicts, as a bulk chunk sends them
        out += engine.run(reqs[at : at + 64 * width])
    failed = sum(not r.ok for r in out)
    if fmt == "likelihood":
        scores = [
            a.value.mean_logprob - b.value.mean_logprob if a.ok and b.ok else None for a, b in zip(out[::2], out[1::2])
        ]
    else:
        scores = [r.choice_probs[0] if r.ok and r.choice_probs else None for r in out]
    truth, docs = [r[3] for r in rows], [r[0] for r in rows]
    result = {
        "verdicts": len(rows),
        "failed": failed,
        "seconds": round(time.perf_counter() - started, 1),
        "auc": with_interval(roc_auc, truth, scores, docs),
        "share_yes": sum(
            1 for s in scores if s is not None and s >= (LIKELIHOOD_THRESHOLD if fmt == "likelihood" else 0.5)
        )
        / len(rows),
    }
    if fmt == "likelihood":
        hard = [None if s is None else s >= LIKELIHOOD_THRESHOLD for s in scores]
        result["balanced_accuracy_at_threshold"] = with_interval(balanced_accuracy, truth, hard, docs)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="the folder holding the agreement files")
    ap.add_argument("--model", default=None)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--data", default="frank_finesure_gpt4o,realsumm_keyfacts")
    args = ap.parse_args()
    global DATA
    DATA = args.data_dir
    judge = load_judge(args.model)
    engine = TransformersEngine(judge)
    report = {"judge": judge.describe(), "threshold": LIKELIHOOD_THRESHOLD, "results": {}}
    for which in args.data.split(","):
        for fmt in args.formats.split(","):
            report["results"][f"{which} | {fmt}"] = got = measure(engine, which, fmt)
            print(
                f"{which} | {fmt}: AUC {got['auc']['value']:.3f} {got['auc']['ci']} ({got['seconds']} s)",
                file=sys.stderr,
                flush=True,
            )
    lines = [
        f"# Verdict formats, judge {judge.name} ({judge.device}, {judge.dtype})",
        "",
        "ROC AUC of the judge's P(yes) (likelihood: PMI) against the human labels, 95% bootstrap interval over "
        "documents; 0.5 is chance. Share of yes: at P >= 0.5 (likelihood: PMI >= "
        f"{LIKELIHOOD_THRESHOLD}).",
        "",
        "| data | format | verdicts | ROC AUC | share of yes | balanced accuracy at the threshold | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, got in report["results"].items():
        which, fmt = key.split(" | ")
        auc, ba = got["auc"], got.get("balanced_accuracy_at_threshold")
        ci = f" [{auc['ci'][0]:.2f}, {auc['ci'][1]:.2f}]" if auc["ci"] else ""
        ba_text = f"{ba['value']:.3f} [{ba['ci'][0]:.2f}, {ba['ci'][1]:.2f}]" if ba and ba["ci"] else "-"
        lines.append(
            f"| {which} | {fmt} | {got['verdicts']} | {auc['value']:.3f}{ci} | {got['share_yes']:.2f} | "
            f"{ba_text} | {got['seconds']} |"
        )
    markdown = "\n".join(lines) + "\n"
    name = Path(args.model).name if args.model else "embedded"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"verdict_formats_{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / f"verdict_formats_{name}.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
