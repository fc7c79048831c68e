"""The ladder's report: each row's flips and ratios, the workload's physical floor, the markdown table and the JSON,
written after every rung."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from benchmarks.lib.engine_choice import section
from benchmarks.lib.llamacpp_peer import llamacpp_note
from benchmarks.lib.outcomes import flip_rate, row_outcomes
from benchmarks.lib.peaks import physical_floor
from benchmarks.lib.vllm_peer import OURS_FOR, peer_note
from benchmarks.lib.workloads import inputs_note
from offline_sumscore.engine.local import TransformersEngine

RESULTS = Path(__file__).resolve().parents[1] / "results"


def derive(cfg, judge, peaks, rows, outputs, ladder_order) -> tuple[list[dict], float | None, dict | None]:
    """Each row's flip rate against rung 0 and its ratios; the standard workload's physical floor and the rung it
    was taken from. Returns the rows in ladder order, the floor per sample and that rung's row."""
    workloads = ("standard", "shared", "bulk")
    order = {rung: k for k, rung in enumerate(ladder_order)}
    rows = sorted(rows, key=lambda r: (workloads.index(r["workload"]), order[r["rung"]]))
    for row in rows:
        done = outputs[row["workload"]]
        # Rungs 7b and 8 judge otherwise (no reasons; other items), and L on questions of its own: no flip rate
        # against rung 0 (L's agreement on the same claims is in its paragraph).
        row["flip_rate_vs_rung0"] = (
            flip_rate(done["0"], done[row["rung"]])
            if "0" in done and row["rung"] not in ("7b", "8", "V8", "L")
            else None
        )
        # vLLM's rungs against our full engine on the same design: the verdicts that differ, and the time ratio.
        ours = OURS_FOR.get(row["rung"])
        row["flip_rate_vs_ours"] = flip_rate(done[ours], done[row["rung"]]) if ours in done else None
    # One floor for the standard workload: the least work that gives the same verdicts, i.e. the token and pass
    # counts of the rung that ran the fewest tokens per sample (rungs 0 and 1 may run fewer samples than the
    # others). Every standard rung's time is set against it.
    standard = [r for r in rows if r["workload"] == "standard" and r["rung"] not in ("7b", "8", "V", "V8", "L")]
    least = min(
        standard,
        key=lambda r: (r["prefill_tokens"] + r["forced_tokens"] + r["decoded_tokens"]) / r["samples"],
        default=None,
    )
    floor_per_sample = None
    if least is not None:
        avg_context = least["prefill_tokens"] / max(1, least["samples"] * (2 + cfg["questions"]))
        floor = physical_floor(
            judge,
            peaks,
            least["prefill_tokens"] + least["forced_tokens"] + least["decoded_tokens"],
            least["decoded_tokens"],
            least["forward_passes"],
            avg_context,
        )
        floor_per_sample = floor / least["samples"]
    for workload in workloads:
        mine = [r for r in rows if r["workload"] == workload]
        base = next((r for r in mine if r["rung"] == "0"), None)  # ratios against rung 0 once it has run
        for prev, row in zip([None] + mine[:-1], mine):
            row["x_rung0"] = row["samples_per_s"] / base["samples_per_s"] if base else None
            row["x_previous"] = row["samples_per_s"] / prev["samples_per_s"] if prev else None
            row["prefill_per_sample_vs_rung0"] = (
                base["prefill_per_sample"] / max(row["prefill_per_sample"], 1e-9) if base else None
            )
            row["pct_of_floor"] = (
                100 * floor_per_sample * row["samples"] / row["seconds"]
                if workload == "standard" and floor_per_sample
                else None
            )
    return rows, floor_per_sample, least


def write_report(args, cfg, judge, peaks, inputs, rows, outputs, ladder_order) -> tuple[str, dict]:
    """Ratios, the floor, the table, in ladder order; written after every rung, so a run cut short keeps what it
    measured. Returns the markdown and the report."""
    rows, floor_per_sample, least = derive(cfg, judge, peaks, rows, outputs, ladder_order)
    vllm, vllm_record = peer_note(args, rows)
    llamacpp, llamacpp_record = llamacpp_note(args, rows, outputs)
    report = {
        "config": args.config,
        "settings": cfg,
        "judge": judge.describe(),
        "engine": {k: v for k, v in TransformersEngine(judge).describe().items() if k != "judge"},
        "peaks": peaks,
        "floor_seconds_per_sample": floor_per_sample,
        "floor_from_rung": least and least["rung"],
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "inputs": inputs_note(args.data),
        "rows": rows,
        "vllm": vllm_record or vllm,
        "llamacpp": llamacpp_record or llamacpp,
    }
    table = [
        "| workload | rung | feature | samples | s | s, every run | samples/s | questions/s | prefill tok/sample | "
        "x fewer prefill | decoded tok/s | drafts kept | passes | x rung 0 | x previous | flips vs 0 | "
        "flips vs ours | % of floor | NaN |",
        "|" + "---|" * 19,
    ]

    def num(value, form="{:.2f}"):
        return "-" if value is None else form.format(value)

    for r in rows:
        flips = "-" if r["flip_rate_vs_rung0"] is None else f"{100 * r['flip_rate_vs_rung0']:.1f}%"
        flips_ours = "-" if r.get("flip_rate_vs_ours") is None else f"{100 * r['flip_rate_vs_ours']:.1f}%"
        drafts = f"{r['accepted_draft_tokens']} of {r['draft_tokens']}" if r.get("draft_tokens") else "-"
        table.append(
            f"| {r['workload']} | {r['rung']} | {r['feature']} | {r['samples']} | {r['seconds']:.1f} | "
            f"{', '.join(f'{x:.1f}' for x in r['runs_s'])} | "
            f"{r['samples_per_s']:.3f} | {r['questions_per_s']:.3f} | {r['prefill_per_sample']:.0f} | "
            f"{num(r['prefill_per_sample_vs_rung0'])} | {r['decoded_tok_per_s']:.1f} | {drafts} | "
            f"{r['forward_passes']} | "
            f"{num(r['x_rung0'])} | {num(r['x_previous'])} | {flips} | {flips_ours} | "
            f"{num(r['pct_of_floor'], '{:.1f}%')} | "
            f"{r['nan_values'] + (r['nan_rows'] or 0)} |"
        )
    syncs = [r for r in rows if r.get("sync_warnings") is not None]
    sync_note = (
        "".join(
            f" Rung {r['rung']} ({r['workload']}): {r['sync_warnings']} synchronising calls warned by "
            f"torch.cuda.set_sync_debug_mode over {r['forward_passes']} forward passes."
            for r in syncs
        )
        if syncs
        else ""
    )
    shared_note = (
        f"The shared workload: {cfg['shared_docs']} documents x {cfg['per_doc']} summaries; its rungs 0 "
        f"and 1 run on the first {cfg['shared_reference_samples']} samples (rates are per sample)."
    )
    markdown = (
        f"# Throughput ladder, config {args.config}\n\n**Inputs: {inputs_note(args.data)}.** "
        f"{len(inputs)} samples, {cfg['questions']} questions, "
        f"{args.repeats} run(s) of the whole ladder, each rung's time the median of its runs, "
        f"judge {judge.name} ({judge.device}, {judge.dtype}); peaks measured: "
        f"{peaks['flops_per_s'] / 1e9:.1f} GFLOP/s, {peaks['bytes_per_s'] / 1e9:.1f} GB/s; workload floor "
        f"{num(floor_per_sample, '{:.3f}')} s per sample (from rung {least and least['rung']}'s token and "
        f'pass counts). {shared_note} "x fewer prefill": rung 0\'s prefill tokens per sample over the '
        f"rung's. NaN: values that came out NaN (P(yes), scores) plus rows the engine failed for NaN logits."
        f"{sync_note}\n\n" + "\n".join(table) + f"\n\n{vllm}\n\n{llamacpp}\n" + profile_table(rows)
    )
    out = args.out or RESULTS / f"throughput_{args.config}"
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n")
    if Path(out) == RESULTS / "throughput_cpu":  # the table a CPU user picks an engine by (engine_choice.py)
        markdown += "\n" + section(RESULTS)
    Path(f"{out}.md").write_text(markdown)
    Path(f"{out}_verdicts.json").write_text(json.dumps(row_outcomes(outputs)) + "\n")
    return markdown, report


def profile_table(rows: list[dict]) -> str:
    """Where each engine's time goes, per rung of our full engine and of vLLM: tokens computed, served from a cache,
    decoded and forced, forward passes (vLLM: engine steps) and the time per pass."""
    lines = [
        "",
        "Profile (counts from the first run, time from the median): prompt tokens computed, served from a prefix "
        "cache or store, forced by the grammar (not decoded), decoded; forward passes (vLLM: engine steps).",
        "",
        "| workload | rung | computed prompt tok | cached prompt tok | forced tok | decoded tok | passes | ms/pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["rung"] not in ("7", "8", "V", "V8", "L"):
            continue
        cached = r["cached_prompt_tokens"] if r.get("cached_prompt_tokens") is not None else r["stored_tokens"]
        per = 1000 * r["seconds"] / max(1, r["forward_passes"])
        lines.append(
            f"| {r['workload']} | {r['rung']} | {r['prefill_tokens']} | {cached} | {r['forced_tokens']} | "
            f"{r['decoded_tokens']} | {r['forward_passes']} | {per:.0f} |"
        )
    return "\n".join(lines) + "\n"
