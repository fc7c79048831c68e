"""Where the full engine's time goes on the ladder's bulk workload (many samples, 32 in flight), not its 6-sample one.

    python -m research.bulk_profile --data DATA/summeval_dev.jsonl --samples 40

benchmarks/profile_engine.py profiles the standard workload (6 samples): there a pass carries a few rows. At bulk a
pass carries up to 64 rows, most of them decoding beside a few prompts, and the costs move. Three runs of the same
inputs after a warm-up: (1) every forward pass timed through the engine's timing hook, with the layout of its
attention (each slot's stored columns and fed tokens, read from KVSlots.begin); (2) the same under torch.profiler,
operator self time in profile_engine's categories; (3) the passes of (1) replayed through the bare decoder (the
profile's bound). From the layouts: the attention cells (query x key per kv head and layer) of the call over the
decoding rows (the single call: every slot in its span attends up to the span's longest row) against the cells its
rows need, the part spent on slots in the span that feed a prompt or nothing, and the bytes of keys and values that
call reads each pass. Writes results/bulk_profile.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.lib.engine_profile import bound_shapes, operator_seconds, phase, replay
from benchmarks.lib.workloads import CONFIGS, bulk_inputs, ladder_caps
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.engine.local import EngineFeatures, Timing, TransformersEngine
from offline_sumscore.engine.local.attention import RaggedPass
from offline_sumscore.engine.local.kv_slots import KVGeometry, KVSlots
from offline_sumscore.engine.local.lab import LabSettings
from research.tables import publish

HERE = Path(__file__).resolve().parent


def timed_run(judge, inputs, options) -> tuple[float, list[dict], list[RaggedPass], dict]:
    """One run with every pass timed and every pass's attention layout kept."""
    log: list[dict] = []
    layouts: list[RaggedPass] = []

    def record(t: Timing) -> None:
        log.append({"phase": phase(t), "rows": t.rows, "real": t.tokens, "s": t.seconds, "cells": t.cells})

    begin = KVSlots.begin

    def keep_layout(self, counts):
        layout = begin(self, counts)
        layouts.append(layout)  # its arrays are its own: the slots build new ones each pass
        return layout

    KVSlots.begin = keep_layout
    try:
        engine = TransformersEngine(judge, lab=LabSettings(features=EngineFeatures(), on_timing=record))
        started = time.perf_counter()
        SummarizationScorer(engine=engine, **options).score_many(inputs, on_error="return")
        wall = time.perf_counter() - started
    finally:
        KVSlots.begin = begin
    return wall, log, layouts, engine.stats.as_dict()


def profiled_run(judge, inputs, options) -> tuple[float, dict]:
    engine = TransformersEngine(judge)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        SummarizationScorer(engine=engine, **options).score_many(inputs, on_error="return")
        wall = time.perf_counter() - started
    return wall, dict(operator_seconds(prof))


def single_call_cells(layouts: list[RaggedPass]) -> dict:
    """Cells of the call over the decoding rows (each layout's single call), by what the slots in its span feed."""
    out = defaultdict(int)
    for layout in layouts:
        if layout.single is None:
            continue
        a, b, top = layout.single_span
        stops, feeds = (layout.filled + layout.counts)[a:b], layout.counts[a:b]
        out["computed"] += (b - a) * top
        out["needed"] += int(stops[feeds == 1].sum())
        out["padding of decoding rows"] += int((feeds == 1).sum()) * top - int(stops[feeds == 1].sum())
        out["slots feeding a prompt or draft"] += int((feeds > 1).sum()) * top
        out["slots feeding nothing"] += int((feeds == 0).sum()) * top
        out["passes"] += 1
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--name", default="bulk_profile")
    args = ap.parse_args()
    cfg = CONFIGS["cpu"]
    judge = load_judge("smollm2-135m")
    inputs = bulk_inputs(args.data, args.samples, cfg["source_chars"])
    options = ladder_caps(cfg)
    SummarizationScorer(engine=TransformersEngine(judge), **options).score_many(inputs[:2], on_error="return")  # warm
    wall, log, layouts, stats = timed_run(judge, inputs, options)
    print(f"timed run: {wall:.1f} s", flush=True)
    profiled_wall, spent = profiled_run(judge, inputs, options)
    print(f"profiled run: {profiled_wall:.1f} s", flush=True)
    passes = [p for p in log if p["phase"] != "masks"]
    with torch.inference_mode():
        judge.model.model(input_ids=torch.zeros((1, 8), dtype=torch.long), use_cache=False)  # warm-up
        bare = replay(judge.model.model, bound_shapes(passes), judge.model.device)
    geometry = KVGeometry.of(judge.model.config, torch.float32)
    cell_bytes = geometry.bytes_per_token // geometry.layers // geometry.kv_heads  # keys + values of one column
    single = single_call_cells(layouts)
    read_gb = single["computed"] * cell_bytes * geometry.kv_heads * geometry.layers / 1e9
    lines = [
        f"# The full engine at bulk: {len(inputs)} samples of the ladder's bulk workload",
        "",
        f"Judge {judge.name} (cpu, float32), torch threads {torch.get_num_threads()}. Command: `python -m "
        f"research.bulk_profile --data DATA/summeval_dev.jsonl --samples {len(inputs)}`. Counters: "
        + ", ".join(f"{k} {v}" for k, v in stats.items() if isinstance(v, int) and v),
        "",
        "## Pass by pass (the timed run)",
        "",
        "| phase | passes | s | tokens | mean rows | s per pass |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("prompt step", "step", "likelihood", "masks"):
        mine = [p for p in log if p["phase"] == name]
        if mine:
            s = sum(p["s"] for p in mine)
            lines.append(
                f"| {name} | {len(mine)} | {s:.1f} | {sum(p['real'] for p in mine)} | "
                f"{statistics.mean(p['rows'] for p in mine):.1f} | {s / len(mine):.3f} |"
            )
    outside = wall - sum(p["s"] for p in log)
    lines += [
        f"| outside the passes and masks | | {outside:.1f} | | | |",
        "",
        f"Wall {wall:.1f} s. The same passes through the bare decoder (the profile's bound): {bare:.1f} s, so the "
        f"engine runs at {bare / wall:.0%} of its bound.",
        "",
        f"## Operators (the profiled run, {profiled_wall:.1f} s wall; self CPU time)",
        "",
        "| category | s | share of wall |",
        "|---|---|---|",
    ]
    for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {s:.1f} | {s / profiled_wall:.0%} |")
    lines.append(f"| the rest (Python, grammar, waits) | {profiled_wall - sum(spent.values()):.1f} | |")
    lines += [
        "",
        "## The attention call over the decoding rows",
        "",
        "Each pass attends its decoding rows (one token each) in one call over the span of slots from the first to "
        "the last of them, every slot up to the span's longest row. Cells: query-token x key columns per kv head "
        "and layer.",
        "",
        "| passes | cells computed | cells its rows need | padding of decoding rows | slots feeding a prompt or "
        "draft | slots feeding nothing | keys and values read per pass |",
        "|---|---|---|---|---|---|---|",
        f"| {single['passes']} | {single['computed']} | {single['needed']} | {single['padding of decoding rows']} | "
        f"{single['slots feeding a prompt or draft']} | {single['slots feeding nothing']} | "
        f"{read_gb / max(single['passes'], 1):.2f} GB |",
    ]
    publish(args.name, lines)


if __name__ == "__main__":
    main()
