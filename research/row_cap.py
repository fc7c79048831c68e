"""Bigger passes on a CPU: the full engine on the ladder's bulk workload under several row caps (batch_size), in turns.

    python -m research.row_cap --data DATA/summeval_dev.jsonl --caps 64,128,256 --samples 100 --repeats 2

The CPU default is 64 rows a batch (capacity.py). vLLM's CPU build schedules up to 256 sequences a step, and at bulk
its steps carry about 1,210 tokens against our passes' 527: each pass reads every weight once, so fewer, larger
passes read them fewer times. For each cap: wall, samples/s, forward passes, tokens per pass, and the verdicts
against the default cap's (flips; the largest change of a P(yes)). The caps run in turns (64, 128, 256, 256, 128,
64, ...) so the machine's drift falls on all of them. Prints a markdown table; writes results/row_cap.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.lib.workloads import CONFIGS, bulk_inputs, ladder_caps
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.engine.local import TransformersEngine
from research.engine_ab import compare  # (verdicts, flips, largest P(yes) change)

HERE = Path(__file__).resolve().parent


def verdicts_of(results) -> list:
    rows = [r.to_dict() if hasattr(r, "to_dict") else {"error": str(r)} for r in results]
    return [
        [(v.get("supported"), v.get("p_supported")) for v in r.get("claims") or []]
        + [(v.get("answered"), v.get("p_answered")) for v in r.get("coverage_verdicts") or []]
        for r in rows
    ]


def in_turns(values: list, engine_for, inputs, options: dict, repeats: int, label: str) -> dict:
    """The bulk workload under each setting value, in turns (a, b, c, c, b, a, ...): each value's walls, verdicts,
    forward passes and tokens. engine_for(value) makes the engine."""
    runs: dict = {}
    for turn in range(repeats):
        for value in values if turn % 2 == 0 else values[::-1]:
            engine = engine_for(value)
            started = time.perf_counter()
            results = SummarizationScorer(engine=engine, **options).score_many(inputs, on_error="return")
            wall = time.perf_counter() - started
            s = engine.stats
            tokens = s.prefill_tokens + s.decoded_tokens + s.forced_tokens + s.draft_tokens
            run = runs.setdefault(value, {"walls": [], "verdicts": verdicts_of(results)})
            run["walls"].append(wall)
            run.update(passes=s.forward_passes, tokens=tokens)
            print(f"{label} {value}: {wall:.1f} s, {s.forward_passes} passes, {tokens} tokens", flush=True)
    return runs


def turns_table(runs: dict, values: list, samples: int, label: str) -> list[str]:
    """One line per value: median wall, every run's, samples/s, passes, tokens a pass, and its verdicts against the
    first value's (flips, the largest change of a P(yes))."""
    base = values[0]
    lines = [
        f"| {label} | median s | runs s | samples/s | forward passes | tokens a pass | flips vs {base} "
        "| largest P(yes) change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for value in values:
        run = runs[value]
        median = statistics.median(run["walls"])
        total, flips, worst = compare(runs[base]["verdicts"], run["verdicts"])
        lines.append(
            f"| {value} | {median:.1f} | {' / '.join(f'{w:.1f}' for w in run['walls'])} | {samples / median:.3f} | "
            f"{run['passes']} | {run['tokens'] / run['passes']:.0f} | {flips} of {total} | {worst:.1e} |"
        )
    return lines


def bulk_options() -> dict:
    return ladder_caps(CONFIGS["cpu"])


def turns_parser(description: str, *, samples: int, name: str) -> argparse.ArgumentParser:
    """The options every in-turns script takes (its own list of values comes on top)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--name", default=name)
    return ap


def warm_bulk(data: Path, samples: int) -> tuple:
    """The embedded judge, the bulk workload's inputs and options, and one warm-up run of two samples."""
    judge = load_judge("smollm2-135m")
    inputs = bulk_inputs(data, samples, CONFIGS["cpu"]["source_chars"])
    options = bulk_options()
    SummarizationScorer(engine=TransformersEngine(judge), **options).score_many(inputs[:2], on_error="return")
    return judge, inputs, options


def main() -> None:
    ap = turns_parser(__doc__.splitlines()[0], samples=100, name="row_cap")
    ap.add_argument("--caps", default="64,128,256")
    args = ap.parse_args()
    caps = [int(c) for c in args.caps.split(",")]
    judge, inputs, options = warm_bulk(args.data, args.samples)
    runs = in_turns(caps, lambda cap: TransformersEngine(judge, batch_size=cap), inputs, options, args.repeats, "cap")
    lines = [
        f"# Row cap on a CPU: the full engine on the bulk workload ({len(inputs)} samples, {args.repeats} runs a cap)",
        "",
        *turns_table(runs, caps, len(inputs), "rows a batch"),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / f"{args.name}.md").write_text(text)


if __name__ == "__main__":
    main()
