"""llama.cpp beside the ladder (rung L): llama-server (`make llamacpp-env`) on the judge's own GGUF file, asked
through --judge-url's engine (ServedEngine) on rung 7's workload, its settings chosen by measurement before the ladder,
started afresh before every timed run (its prompt caches, in the slots and in RAM, empty, as each of our runs starts
with an empty prefix store; the start untimed), and the
paragraph and record that set our engine against it: samples/s, peak memory, and agreement on the same claims.

llama-server cannot run rung 8 (the embedded design reads a given text's log-probabilities, which its chat API does
not return): the record says so. The claims (the summary's sentences) are the same on both sides, and each claim's
verdict is compared; the questions are each engine's own (the same grammar, in the same layout, but other numerics:
llama.cpp rounds activations to 8 bits), so coverage verdicts are compared where both drew the same questions.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks.lib.loopback import LoopbackServer
from benchmarks.lib.workloads import rungs_asked
from offline_sumscore import SummarizationScorer
from offline_sumscore.engine.openai_compatible import ServedEngine

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".llamacpp" / "bin" / "llama-server"
CONTEXT_PER_SLOT = 4096  # the ladder's longest prompt (a 1,200-character source and its instructions) fits twice


def gguf_of(model: str | None) -> Path | None:
    """The GGUF file a ladder judge was loaded from: the embedded judge's, a preset's .gguf, or a .gguf path."""
    from offline_sumscore.engine.gguf_convert import embedded_gguf_path
    from offline_sumscore.engine.presets import models_root, presets

    if model in (None, "smollm2-135m"):
        return embedded_gguf_path()
    preset = presets().get(model, {})
    if str(preset.get("path", "")).endswith(".gguf"):
        return models_root() / preset["path"]
    return Path(model) if str(model).endswith(".gguf") else None


def llamacpp_absent(args) -> str | None:
    """Why the ladder runs no llama.cpp rung, in a sentence; None where it runs them."""
    if "L" not in rungs_asked(args):
        return "No llama.cpp rung was asked for (L)."
    if args.config != "cpu":
        return f"No llama.cpp rung was run: it runs with --config cpu only, and this ladder ran --config {args.config}."
    if not LLAMA_SERVER.exists():
        return "llama-server is not built here: no llama.cpp rung was run (`make llamacpp-env`)."
    if gguf_of(args.model) is None:
        return f"llama-server reads GGUF files, and the judge {args.model} is not one: no llama.cpp rung was run."
    return None


class LlamaPeer(LoopbackServer):
    """One llama-server process on a loopback port, its settings, its start-up and its settings sweep."""

    def __init__(self, gguf: Path, parallel: int, threads: int):
        self.gguf, self.parallel, self.threads = gguf, parallel, threads
        log = tempfile.NamedTemporaryFile("w", prefix="llama-server-", suffix=".log", delete=False)

        def command(port: int) -> list[str]:
            args = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
            args += ["-c", str(CONTEXT_PER_SLOT * parallel), "--parallel", str(parallel), "-t", str(threads)]
            args += ["-tb", str(threads), "--cont-batching", "--cache-prompt", "--alias", "judge", "--seed", "0"]
            return args + ["--no-webui"]

        super().__init__("llama-server", command, log, ready="/health", patience=300)
        self.sweep, self.warm_s = [], 0.0
        started = time.perf_counter()
        self.start()
        self.startup_s = time.perf_counter() - started

    def settings(self) -> dict:
        return {
            "threads": self.threads,
            "parallel": self.parallel,
            "context_per_slot": CONTEXT_PER_SLOT,
            "continuous_batching": True,
            "prompt_cache": True,
            "command": " ".join(Path(a).name if a.startswith("/") else a for a in self.args),
        }

    def engine(self) -> ServedEngine:
        """A fresh client for a timed run, on a server started afresh: nothing cached from an earlier run."""
        self.stop()
        self.start()
        return ServedEngine(self.url, "judge", concurrency=self.parallel, timeout=3600)


def start_llamacpp(args, judge, inputs: list[dict], caps: dict) -> LlamaPeer | None:
    """llama-server at the settings that ran the standard workload fastest here: threads = this machine's cores,
    continuous batching and the prompt cache on (its defaults), and --parallel swept over args.llama_parallel, each
    setting warmed on one sample and then timed on the whole standard workload; the fastest kept, the sweep recorded.
    None where the ladder runs no llama.cpp rung (llamacpp_absent says why)."""
    if llamacpp_absent(args):
        return None
    gguf, threads = gguf_of(args.model), os.cpu_count() or 1
    sweep = []
    for parallel in [int(p) for p in args.llama_parallel.split(",")]:
        peer = LlamaPeer(gguf, parallel, threads)
        try:
            SummarizationScorer(engine=peer.engine(), **caps).score_many(inputs[:1], on_error="return")
            started = time.perf_counter()
            SummarizationScorer(engine=peer.engine(), **caps).score_many(inputs, on_error="return")
            seconds = time.perf_counter() - started
        finally:
            peer.stop()
        sweep.append({"parallel": parallel, "seconds": round(seconds, 2), "samples_per_s": len(inputs) / seconds})
    best = max(sweep, key=lambda s: s["samples_per_s"])
    peer = LlamaPeer(gguf, best["parallel"], threads)
    started = time.perf_counter()
    SummarizationScorer(engine=peer.engine(), **caps).score_many(inputs, on_error="return")  # warmed as ours
    peer.warm_s, peer.sweep = time.perf_counter() - started, sweep
    peer.given = given_questions_agreement(judge, peer, inputs, caps)
    return peer


def given_questions_agreement(judge, peer: LlamaPeer, inputs: list[dict], caps: dict) -> dict:
    """Both engines on the same claims and the same questions (our engine's, given as the rows' questions): how far
    the numerics alone move verdicts and scores, with nothing drawn differently. Untimed."""
    from offline_sumscore.engine.local import TransformersEngine

    drawn = SummarizationScorer(engine=TransformersEngine(judge), **caps).score_many(inputs, on_error="return")
    given = [
        dict(item, questions=list(r.questions))
        for item, r in zip(inputs, drawn)
        if not getattr(r, "error", None) and r.questions
    ]
    ours = SummarizationScorer(engine=TransformersEngine(judge), **caps).score_many(given, on_error="return")
    theirs = SummarizationScorer(engine=peer.engine(), **caps).score_many(given, on_error="return")
    return claim_agreement(ours, theirs)


def claim_agreement(ours: list, theirs: list) -> dict:
    """Our full engine's rows against llama.cpp's on the same workload: the claims' verdicts (the same sentences on
    both sides), the coverage verdicts of rows that drew the same questions, and the scores."""
    same = total = covered_same = covered = same_questions = 0
    moved, p_moved = [], []
    for a, b in zip(ours, theirs):
        if getattr(a, "error", None) or getattr(b, "error", None):
            continue
        for x, y in zip(a.claims, b.claims):
            total += 1
            same += x["supported"] == y["supported"]
            if x["p_supported"] is not None and y["p_supported"] is not None:
                p_moved.append(abs(x["p_supported"] - y["p_supported"]))
        if a.questions == b.questions:
            same_questions += 1
            for x, y in zip(a.coverage_verdicts, b.coverage_verdicts):
                covered += 1
                covered_same += x["answered"] == y["answered"]
                if x["p_answered"] is not None and y["p_answered"] is not None:
                    p_moved.append(abs(x["p_answered"] - y["p_answered"]))
        moved.append(abs(a.score - b.score))
    return {
        "claims_compared": total,
        "claims_agree": same / total if total else None,
        "rows_with_the_same_questions": same_questions,
        "coverage_compared": covered,
        "coverage_agree": covered_same / covered if covered else None,
        "rows_compared": len(moved),
        "max_score_moved": max(moved, default=None),
        "max_p_yes_moved": max(p_moved, default=None),
        "p_yes_compared": len(p_moved),
        "rows_moved_past_0.1": sum(m > 0.1 for m in moved),
    }


def llamacpp_note(args, rows: list[dict], outputs: dict) -> tuple[str, dict | None]:
    """The llama.cpp rungs' settings, sweep and memory, and our engine against it per workload."""
    import resource

    peer = getattr(args, "llama_peer", None)
    if peer is None:
        return llamacpp_absent(args) or "llama-server did not start.", None
    ratios, agreement = {}, {}
    for row in rows:
        if row["rung"] != "L":
            continue
        mine = next((r for r in rows if r["workload"] == row["workload"] and r["rung"] == "7"), None)
        if mine:
            ratios[f"{row['workload']} 7 vs L"] = mine["samples_per_s"] / row["samples_per_s"]
            agreement[row["workload"]] = claim_agreement(outputs[row["workload"]]["7"], outputs[row["workload"]]["L"])
    record = {
        "version": (LLAMA_SERVER.parent.parent / "VERSION").read_text().strip().splitlines()[0],
        "gguf": peer.gguf.name,
        "settings": peer.settings(),
        "parallel_sweep": peer.sweep,
        "startup_s": round(peer.startup_s, 1),
        "warm_up_s": round(peer.warm_s, 1),
        "server_peak_rss_kb": peer.peak_rss_kb(),
        "ladder_process_peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "ours_x_llamacpp": ratios,
        "agreement": agreement,
        "agreement_on_given_questions": getattr(peer, "given", None),
    }
    sweep = ", ".join(f"--parallel {s['parallel']}: {s['samples_per_s']:.3f} samples/s" for s in peer.sweep)
    agree = "; ".join(
        f"{w}: {100 * a['claims_agree']:.1f}% of {a['claims_compared']} claims; the same questions drawn in "
        f"{a['rows_with_the_same_questions']} of {a['rows_compared']} rows, their verdicts alike "
        + ("-" if a["coverage_agree"] is None else f"{100 * a['coverage_agree']:.1f}% of {a['coverage_compared']}")
        + f"; the largest score moved {a['max_score_moved']:.2f} ({a['rows_moved_past_0.1']} rows past 0.1)"
        for w, a in agreement.items()
        if a["claims_agree"] is not None
    )
    text = (
        f"llama.cpp's llama-server ({record['version']}, built by `make llamacpp-env`) on {peer.gguf.name}, through "
        f"--judge-url's engine (ServedEngine, {peer.parallel} requests at once): `{record['settings']['command']}`. "
        f"--parallel chosen by measurement on the standard workload ({sweep}); threads = the machine's cores; "
        "continuous batching and the prompt cache on; started afresh before each timed run. JSON under our schemas as "
        "GBNF in our layout (engine/gbnf.py), Yes/No under its GBNF grammar, P(yes) from its top log-probabilities. "
        "Start-up "
        f"{record['startup_s']} s and warm-up {record['warm_up_s']} s untimed. Peak resident memory: llama-server "
        f"{(record['server_peak_rss_kb'] or 0) / 2**20:.2f} GiB; this ladder process (every rung of ours, outlines' "
        f"and vLLM's where run) {record['ladder_process_peak_rss_kb'] / 2**20:.2f} GiB. Our full engine against "
        "llama.cpp (samples/s over samples/s): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        + f". Agreement with our full engine: {agree or '-'}. {given_text(record['agreement_on_given_questions'])} "
        "No rung 8: llama-server returns no "
        "log-probabilities of a given text."
    )
    return text, record


def given_text(given: dict | None) -> str:
    if not given or given["claims_agree"] is None:
        return ""
    return (
        f"On the standard workload with our engine's questions given to both (the same claims and questions, only "
        f"the numerics differ): {100 * given['claims_agree']:.1f}% of {given['claims_compared']} claims and "
        + ("-" if given["coverage_agree"] is None else f"{100 * given['coverage_agree']:.1f}%")
        + f" of {given['coverage_compared']} coverage verdicts alike, P(yes) {given['max_p_yes_moved']:.3f} apart "
        f"at most over {given['p_yes_compared']}, the largest score moved {given['max_score_moved']:.2f} "
        f"({given['rows_moved_past_0.1']} of {given['rows_compared']} rows past 0.1)."
    )
