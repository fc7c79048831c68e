"""Where the engine's time goes: the throughput ladder's standard workload under torch.profiler, per engine.

    python -m benchmarks.profile_engine            # embedded judge, rung 5 (waves) and rung 7 (the full engine)

Each engine scores the same frozen inputs as the throughput ladder (6 samples, 3 questions, the design with
something to decode) once untimed (warm-up) and once under the profiler. Operator self time is summed into
categories: matmuls (the weights), attention, KV writes and gathers (index_put, index, copy: a pass's keys and
values into their slots, a shared prefix copied into a unit's rows, the ragged attention's gathers of each run's
queries), grammar masks (llguidance's fill and the unpacking of its bitmask, timed around the call), and the rest
of the wall time, which is Python and everything the profiler does not see as an operator. A third run of each
engine, without the profiler, times every forward pass: the steps that carry prompts (some row feeds more than 16
tokens: a prompt's remainder rides in a step beside the decoding rows), the decoding steps, and likelihood passes,
with their tokens (a ragged pass computes those only) against the rows x widest feed a padded grid would have
computed. Last, those passes replayed through the bare decoder with nothing around them, in pairs beside the full
engine's wall (the engine's share of its bound), and against the naive loop timed in the same run: the most x naive
any scheduling of them could reach. Writes
benchmarks/results/profile_cpu.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.lib.engine_profile import bound_shapes, operator_seconds, phase, replay
from benchmarks.lib.outlines_engine import OutlinesEngine
from benchmarks.lib.workloads import CONFIGS, frozen_inputs, ladder_caps
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.engine.local import EngineFeatures, Timing, TransformersEngine
from offline_sumscore.engine.local.lab import LabSettings

RESULTS = Path(__file__).resolve().parent / "results"


def profile(judge, make_engine, inputs, caps) -> dict:
    SummarizationScorer(engine=make_engine(), **caps).score_many(inputs, on_error="return")  # warm-up
    masks: list[Timing] = []
    engine = make_engine(on_timing=lambda t: masks.append(t) if t.kind == "masks" else None)
    scorer = SummarizationScorer(engine=engine, **caps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        scorer.score_many(inputs, on_error="return")
        wall = time.perf_counter() - started
    spent = operator_seconds(prof)
    seen = sum(spent.values())
    grammar_s = sum(t.seconds for t in masks)
    spent["grammar masks (llguidance fill + unpack)"] = grammar_s
    spent["Python and the rest (wall - operators - grammar)"] = max(0.0, wall - seen - grammar_s)
    return {
        "wall_s": wall,
        "seconds": dict(spent),
        "stats": engine.stats.as_dict(),
        "note": "operator times are summed self CPU time over threads, so with 2 threads they can exceed wall",
    }


def passes(judge, make_engine, inputs, caps) -> dict:
    """One more run, without the profiler (it slows small operators), timing every forward pass through the
    engine's timing hook: a step that carries prompts (some row feeds more than 16 tokens), a decoding step, or a
    likelihood pass. Its tokens are what the ragged pass computes; its slots, rows x widest feed, what a padded grid
    would have."""
    log: list[dict] = []

    def record(t: Timing) -> None:
        if t.kind == "masks":
            return
        log.append(
            {
                "phase": phase(t),
                "rows": t.rows,
                "width": t.width,
                "real": t.tokens,
                "s": t.seconds,
                "cells": t.cells,
                "needed_cells": t.needed_cells,
            }
        )

    engine = make_engine(on_timing=record)
    started = time.perf_counter()
    SummarizationScorer(engine=engine, **caps).score_many(inputs, on_error="return")
    wall = time.perf_counter() - started
    by_phase = {}
    for name in ("prompt step", "step", "likelihood"):
        mine = [p for p in log if p["phase"] == name]
        if mine:
            by_phase[name] = {
                "passes": len(mine),
                "s": sum(p["s"] for p in mine),
                "slots": sum(p["rows"] * p["width"] for p in mine),
                "real_tokens": sum(p["real"] for p in mine),
                "mean_rows": sum(p["rows"] for p in mine) / len(mine),
                "cells": sum(p["cells"] for p in mine),
                "needed_cells": sum(p["needed_cells"] for p in mine),
            }
    return {"wall_s": wall, "outside_passes_s": wall - sum(p["s"] for p in log), "phases": by_phase, "log": log}


def bound(judge, log: list[dict], make_engine, naive_engine, inputs, caps, turns: int = 8) -> dict:
    """The least time the engine's own passes could take on this machine: each logged step that carries prompts as
    its tokens spread evenly over its rows through the bare decoder (no cache, so no attention over stored columns),
    and each decoding step's tokens as that many rows of one token; nothing between the passes. The machine's speed
    swings by a tenth or more within minutes, so the full engine's wall and the bare replay are timed side by side,
    in `turns` pairs of alternating order (engine then replay, replay then engine, ...), and each pair gives the
    engine's share of its bound; the median pair is the figure. Against the naive loop timed in the same run, the
    most x naive any scheduling of these passes could reach here."""
    decoder = judge.model.model
    device = judge.model.device
    shapes = bound_shapes(log)

    def engine_wall() -> float:
        engine = make_engine()
        started = time.perf_counter()
        SummarizationScorer(engine=engine, **caps).score_many(inputs, on_error="return")
        return time.perf_counter() - started

    def bare() -> float:
        with torch.inference_mode():
            return replay(decoder, shapes, device)

    with torch.inference_mode():
        decoder(input_ids=torch.zeros((1, 8), dtype=torch.long, device=device), use_cache=False)  # warm-up
    pairs = []
    for turn in range(turns):
        if turn % 2 == 0:
            wall = engine_wall()
            pairs.append({"wall_s": wall, "bare_decoder_s": bare()})
        else:
            replayed = bare()
            pairs.append({"wall_s": engine_wall(), "bare_decoder_s": replayed})
    middle = statistics.median(p["bare_decoder_s"] / p["wall_s"] for p in pairs)
    started = time.perf_counter()
    SummarizationScorer(engine=naive_engine, **caps).score_many(inputs, on_error="return")
    naive = time.perf_counter() - started
    bare_s = statistics.median(p["bare_decoder_s"] for p in pairs)
    return {
        "pairs": pairs,
        "share_of_bound": middle,
        "around_decoder": 1 - middle,
        "bare_decoder_s": bare_s,
        "naive_loop_s": naive,
        "most_x_naive": naive / bare_s,
    }


def pass_table(engines_report: dict) -> list[str]:
    """The pass-by-pass section: each engine's forward passes by phase, with their tokens and attention cells."""
    lines = [
        "",
        "## Pass by pass",
        "",
        "Another run of each engine, without the profiler, timing every forward pass. A prompt step carries some "
        "row's prompt (a feed of more than 16 tokens) beside the decoding rows. Tokens: what the ragged pass "
        "computes; grid slots: rows x widest feed, what a padded [rows, width] pass would have computed (the share "
        "of those that would have been padding is in the next column). Attention cells: query x key pairs (per kv "
        "head and layer) the attention calls computed, padding included, and the share of those its tokens did not "
        "need (each query needs its row's columns up to its own).",
        "",
        "| engine | wall s | phase | passes | s | s per pass | tokens | grid slots | grid padding | mean rows "
        "| attention cells | attention padding |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in engines_report.items():
        timed = r["passes"]
        for kind, f in timed["phases"].items():
            lines.append(
                f"| {name} | {timed['wall_s']:.1f} | {kind} | {f['passes']} | {f['s']:.1f} | "
                f"{f['s'] / f['passes']:.3f} | {f['real_tokens']} | {f['slots']} | "
                f"{1 - f['real_tokens'] / max(f['slots'], 1):.0%} | {f['mean_rows']:.1f} | {f['cells']} | "
                f"{1 - f['needed_cells'] / max(f['cells'], 1):.0%} |"
            )
        lines.append(
            f"| {name} | {timed['wall_s']:.1f} | outside the passes | | {timed['outside_passes_s']:.1f} | | | | | | | |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="as the ladder's --data (without it: the demo rows)")
    args = ap.parse_args()
    cfg = CONFIGS["cpu"]
    judge = load_judge("smollm2-135m")
    inputs = frozen_inputs(args.data, cfg["samples"], cfg["source_chars"])
    caps = ladder_caps(cfg)

    def engine_with(features: EngineFeatures):
        def make(**hook) -> TransformersEngine:
            # the engine's developer hook: features and the timing hook
            return TransformersEngine(judge, lab=LabSettings(features=features, **hook))

        return make

    engines = {
        "rung 5 (waves, no store)": engine_with(EngineFeatures().without("continuous", "prefix_store")),
        "rung 7 (the full engine)": engine_with(EngineFeatures()),
    }
    report = {name: profile(judge, make, inputs, caps) for name, make in engines.items()}
    for name, make in engines.items():
        report[name]["passes"] = passes(judge, make, inputs, caps)
    full = report["rung 7 (the full engine)"]
    SummarizationScorer(engine=OutlinesEngine(judge, batch=False), **dict(caps, max_questions=1)).score_many(
        inputs[:1], on_error="return"
    )  # warm-up: outlines compiles its mask kernel on first use
    limit = bound(
        judge,
        full["passes"]["log"],
        engines["rung 7 (the full engine)"],
        OutlinesEngine(judge, batch=False),
        inputs,
        caps,
    )
    report["bound"] = limit
    labels = sorted({k for r in report.values() if "seconds" in r for k in r["seconds"]})
    engines_report = {k: v for k, v in report.items() if k != "bound"}
    lines = [
        "# Where the engine's time goes (torch.profiler, CPU)",
        "",
        f"{len(inputs)} samples, {cfg['questions']} questions, the ladder's standard workload; judge "
        f"{judge.name}; torch threads {torch.get_num_threads()}. Operator times are self CPU time summed over "
        "threads (they can exceed the wall time); the last row is what is left of the wall time.",
        "",
        "| | " + " | ".join(engines_report) + " |",
        "|---|" + "---|" * len(engines_report),
        "| wall s | " + " | ".join(f"{r['wall_s']:.1f}" for r in engines_report.values()) + " |",
    ]
    for label in labels:
        lines.append(
            f"| {label} | " + " | ".join(f"{r['seconds'].get(label, 0):.1f}" for r in engines_report.values()) + " |"
        )
    for key in ("prefill_tokens", "stored_tokens", "decoded_tokens", "forced_tokens", "forward_passes"):
        lines.append(f"| {key} | " + " | ".join(str(r["stats"][key]) for r in engines_report.values()) + " |")
    lines += pass_table(engines_report)
    lines += [
        "",
        "## The bound",
        "",
        "The full engine's passes above replayed with nothing around them: each prompt step's tokens spread "
        "evenly over its rows through the bare decoder (no cache: no attention over stored columns), each "
        "decoding step's tokens as that many one-token rows, no Python, copies or grammar between them. The "
        "machine's speed swings by a tenth or more within minutes, so the full engine's wall and this replay are "
        f"timed side by side, in {len(limit['pairs'])} pairs of alternating order; each pair gives the engine's "
        "share of its bound (replay / wall), and the median pair is the figure; what is left of the wall is the "
        "time around the decoder.",
        "",
        "| pair | full engine wall s | bare decoder s | share of the bound |",
        "|---|---|---|---|",
        *(
            f"| {k + 1} | {p['wall_s']:.2f} | {p['bare_decoder_s']:.2f} | {p['bare_decoder_s'] / p['wall_s']:.0%} |"
            for k, p in enumerate(limit["pairs"])
        ),
        "",
        f"**The full engine at {limit['share_of_bound']:.0%} of its bound (median pair), "
        f"{limit['around_decoder']:.0%} of the wall around the decoder.** Against the naive loop (rung 0) timed in "
        "this run, the bound is the most x naive loop any scheduling of the same passes could reach on this machine:",
        "",
        "| bare decoder s (median pair) | naive loop s | most x naive loop |",
        "|---|---|---|",
        f"| {limit['bare_decoder_s']:.1f} | {limit['naive_loop_s']:.1f} | {limit['most_x_naive']:.2f} |",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profile_cpu.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "profile_cpu.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
