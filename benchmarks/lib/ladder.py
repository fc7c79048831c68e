"""The ladder's rungs and its runs: every path warmed up untimed, each rung's engine and scorer options, every rung
of every workload run and measured, the report written after each."""

from __future__ import annotations

import sys
import time
import warnings

import torch

from benchmarks.lib.ladder_report import write_report
from benchmarks.lib.outcomes import nan_count
from benchmarks.lib.outlines_engine import OutlinesEngine
from offline_sumscore import SummarizationScorer
from offline_sumscore.engine.local import EngineFeatures, TransformersEngine
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.engine.openai_compatible import ServedEngine


def warm_up(judge, inputs: list[dict], caps: dict, cfg: dict, *, with_outlines: bool) -> None:
    """Every path a timed rung takes, run once untimed: grammars compiled, kernels loaded, token texts cached, and
    outlines' own processor (its mask kernel compiles on first use). The generating design runs the whole standard
    workload: a process's first run of that size pays for growing its heap (on the 2-core machine 170,000 page
    faults and 1.3 s of system time, against 62,000 and 0.3 s in the run after), and without this the ladder's
    first rung paid it alone (rung 7 8.06 s in the ladder against 7.59 s for rung 7a, where in alternating turns the
    two took 7.71 s and 7.72 s)."""
    SummarizationScorer(engine=TransformersEngine(judge), **caps).score_many(inputs, on_error="return")
    SummarizationScorer(engine=TransformersEngine(judge), key_sentences=cfg["questions"]).score_many(
        inputs[:1], on_error="return"
    )
    if with_outlines:
        for batch in (False, True):
            SummarizationScorer(engine=OutlinesEngine(judge, batch=batch), **dict(caps, max_questions=1)).score_many(
                inputs[:1], on_error="return"
            )


def ladder_rungs(judge, caps: dict, cfg: dict, peer=None, llama_peer=None) -> dict:
    """Each rung: its label, how its engine is made, the scorer's options. peer: the started vLLM engine, or None;
    llama_peer: the started llama-server (llamacpp_peer.LlamaPeer), or None."""
    # Rungs 2 to 7a: the engine without drafts, each adding its feature; rung 7 adds drafts (the default).
    full = EngineFeatures()
    wave = full.without("continuous", "prefix_store", "drafts")  # rungs 2 to 5: the engine before the stream

    def engine(features: EngineFeatures = full):
        def make(**hook) -> TransformersEngine:
            # the engine's developer hook: a rung is the engine with features off (hook: a timing hook, ...)
            return TransformersEngine(judge, lab=LabSettings(features=features, **hook))

        return make

    ladder = {
        "0": (
            "naive loop: outlines Generator per grammar, one call per prompt",
            lambda: OutlinesEngine(judge, batch=False),
            caps,
        ),
        "1": ("outlines .batch per stage", lambda: OutlinesEngine(judge, batch=True), caps),
        "2": (
            "engine in waves: cross-sample iteration-level batching",
            engine(wave.without("shared_prefix", "forced_tokens", "logit_verdicts")),
            caps,
        ),
        "3": ("+ shared prefixes", engine(wave.without("forced_tokens", "logit_verdicts")), caps),
        "4": ("+ forced tokens", engine(wave.without("logit_verdicts")), caps),
        "5": ("+ verdicts from logits", engine(wave), caps),
        "6": ("+ one continuous stream", engine(full.without("prefix_store", "drafts")), caps),
        "7a": ("+ prefix store", engine(full.without("drafts")), caps),
        "7": ("+ n-gram drafts (the full engine)", engine(), caps),
        "7b": ("rung 7 without reasons (include_reason=False)", engine(), dict(caps, include_reason=False)),
        "8": (
            "the embedded design: sentences, key sentences, likelihood verdicts",
            engine(),
            dict(key_sentences=cfg["questions"], claims="sentences", coverage="key_sentences", verdicts="likelihood"),
        ),
    }
    if peer is not None:
        from offline_sumscore.engine.vllm_engine import fresh_stats

        def vllm():
            # Each timed run starts with no prefix cached, as ours starts with an empty prefix store: kept, vLLM's
            # first standard run found the warm-up sample's prefixes (3,968 cached prompt tokens against 3,328 cold,
            # 9.1 s against 9.7 s) and a run right after another found all of its own (6,912; 5.7 s).
            if not peer.engine.llm.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache (requests still running): the run is not cold")
            peer.engine.stats = fresh_stats()
            return peer.engine

        ladder["V"] = (f"vLLM {peer.engine.version} (CPU build), the rung 7 workload", vllm, caps)
        ladder["V8"] = (f"vLLM {peer.engine.version}, the embedded design (rung 8's)", vllm, ladder["8"][2])
    if llama_peer is not None:
        label = f"llama.cpp llama-server (--parallel {llama_peer.parallel}), the rung 7 workload"
        ladder["L"] = (label, llama_peer.engine, caps)
    return ladder


def run_ladder(args, cfg, judge, peaks, inputs, ladder: dict, workloads: dict) -> tuple[str, dict]:
    """Every rung of every workload, repeats times; the table and the report written after each rung."""
    rows: list[dict] = []
    outputs: dict = {workload: {} for workload in workloads}  # workload -> rung -> results
    # Every rung runs `repeats` times, the whole ladder over before any rung again, so that a slow spell of the
    # machine (the 2-core machines here swing by a fifth within minutes) falls on every rung alike; each rung's
    # time is the median of its runs, and its range is kept.
    measured: dict[tuple[str, str], dict] = {}
    for repeat in range(args.repeats):
        for workload, (items, reference, rungs) in workloads.items():
            for rung in rungs:
                label, make, options = ladder[rung]
                engine = make()
                scorer = SummarizationScorer(engine=engine, **options)
                batch = items[:reference] if isinstance(engine, OutlinesEngine) else items
                if judge.model.device.type == "cuda":
                    torch.cuda.synchronize()
                watch = judge.model.device.type == "cuda" and rung == "7" and repeat == 0
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if watch:  # every call that makes the host wait for the GPU warns (timed with it: a small cost)
                        torch.cuda.set_sync_debug_mode("warn")
                    started = time.perf_counter()
                    try:
                        results = scorer.score_many(batch, on_error="return")
                    finally:
                        if watch:
                            torch.cuda.set_sync_debug_mode(0)
                    if judge.model.device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds = time.perf_counter() - started
                key = (workload, rung)
                if key not in measured:  # counts come from the first run (every run does the same work)
                    outputs[workload][rung] = results
                    measured[key] = row = measure(engine, workload, rung, label, batch, results)
                    row["sync_warnings"] = sum(1 for w in caught if "synchroniz" in str(w.message)) if watch else None
                    rows.append(row)
                row = measured[key]
                row["runs_s"] = row.get("runs_s", []) + [round(seconds, 2)]
                timed(row)
                markdown, report = write_report(args, cfg, judge, peaks, inputs, rows, outputs, list(ladder))
                print(
                    f"{workload} rung {rung} (run {repeat + 1} of {args.repeats}): {seconds:.1f} s, "
                    f"{len(batch) / seconds:.3f} samples/s, {row['prefill_per_sample']:.0f} prefill tokens a sample "
                    "(written)",
                    file=sys.stderr,
                    flush=True,
                )
    return markdown, report


def measure(engine, workload: str, rung: str, label: str, batch: list, results: list) -> dict:
    """A rung's row: what it ran and counted (the same in every run of it); timed() adds the rates."""
    cached = None
    if isinstance(engine, OutlinesEngine):
        prefill, forced, decoded, passes = engine.prefill_tokens, 0, engine.decoded_tokens, engine.forward_passes
        stored = drafted = kept = 0
    elif isinstance(engine, ServedEngine):  # llama-server: the prompt and output tokens it reported per stage
        stages = [st for r in results if not getattr(r, "error", None) for st in r.stages.values()]
        prefill, decoded = (sum(st.get(k) or 0 for st in stages) for k in ("tokens_in", "tokens_out"))
        forced = passes = stored = drafted = kept = 0  # not reported by the server
    elif isinstance(engine.stats, dict):  # vLLM: prompt tokens its prefix cache served are not computed
        s = engine.stats
        cached = s["cached_prompt_tokens"]
        prefill, forced, decoded, passes = s["prompt_tokens"] - cached, 0, s["decoded_tokens"], s["steps"]
        stored = drafted = kept = 0
    else:
        s = engine.stats
        prefill, forced, decoded, passes = s.prefill_tokens, s.forced_tokens, s.decoded_tokens, s.forward_passes
        stored, drafted, kept = s.stored_tokens, s.draft_tokens, s.accepted_draft_tokens
    return {
        "workload": workload,
        "rung": rung,
        "feature": label,
        "samples": len(batch),
        "questions": sum(len(r.coverage_verdicts) for r in results if not getattr(r, "error", None)),
        "prefill_tokens": prefill,
        "forced_tokens": forced,
        "decoded_tokens": decoded,
        "forward_passes": passes,
        "stored_tokens": stored,
        "draft_tokens": drafted,
        "accepted_draft_tokens": kept,
        "prefill_per_sample": prefill / len(batch),
        "failed_rows": sum(1 for r in results if getattr(r, "error", None)),
        "nan_values": nan_count(results),
        "nan_rows": getattr(getattr(engine, "stats", None), "nan_rows", 0),
        "cached_prompt_tokens": cached,
    }


def timed(row: dict) -> None:
    """The row's time (the median of its runs) and the rates from it."""
    import statistics

    seconds = statistics.median(row["runs_s"])
    row["seconds"] = round(seconds, 2)
    row["samples_per_s"] = row["samples"] / seconds
    row["questions_per_s"] = row["questions"] / seconds
    for kind in ("prefill", "forced", "decoded"):
        row[f"{kind}_tok_per_s"] = row[f"{kind}_tokens"] / seconds
