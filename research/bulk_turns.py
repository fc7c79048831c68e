"""The bulk workload under several values of one engine setting, in turns, and two runs' verdicts compared: what
row_cap.py, pass_tokens.py and kv_memory.py run, and engine_ab.py's comparison of two trees' verdicts."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.lib.workloads import CONFIGS, bulk_inputs, ladder_caps
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.engine.local import TransformersEngine


def compare(a: list, b: list) -> tuple[int, int, float]:
    """Verdicts, flips and the largest P(yes) change between two runs' verdict lists."""
    total = flips = 0
    largest = 0.0
    for ra, rb in zip(a, b):
        for (va, pa), (vb, pb) in zip(ra, rb):
            total += 1
            flips += va != vb
            if pa is not None and pb is not None:
                largest = max(largest, abs(pa - pb))
    return total, flips, largest


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
