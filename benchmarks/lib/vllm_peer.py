"""vLLM beside the ladder (rungs V and V8): why it runs no vLLM rung where it does not, the engine started and
warmed once before the ladder, and the paragraph and record that set our engine's speed against it."""

from __future__ import annotations

import json
import time

from benchmarks.lib.workloads import rungs_asked
from offline_sumscore import SummarizationScorer

OURS_FOR = {"V": "7", "V8": "8"}  # each vLLM rung's counterpart: our full engine on the same design


def vllm_absent(args) -> str | None:
    """Why the ladder runs no vLLM rung, in a sentence; None where it runs them."""
    import importlib.util

    if not any(r.startswith("V") for r in rungs_asked(args)):
        return "No vLLM rung was asked for (the rungs named V...)."
    if args.config != "cpu":
        return f"No vLLM rung was run: they run with --config cpu only, and this ladder ran --config {args.config}."
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not importable in this environment: no vLLM rung was run (`make vllm-env`, then run this with "
            ".venv-vllm/bin/python)."
        )
    return None


def peer_note(args, rows: list[dict]) -> tuple[str, dict | None]:
    """The vLLM rungs' settings and our engine's speed against vLLM's per workload, as a paragraph and a record."""
    peer = getattr(args, "peer", None)
    if peer is None:
        return vllm_absent(args) or "vLLM's engine did not start.", None
    described = peer.engine.describe()
    ratios = {}
    for row in rows:
        ours = OURS_FOR.get(row["rung"])
        mine = next((r for r in rows if r["workload"] == row["workload"] and r["rung"] == ours), None)
        if mine:
            ratios[f"{row['workload']} {ours} vs {row['rung']}"] = mine["samples_per_s"] / row["samples_per_s"]
    record = {
        "version": peer.engine.version,
        "settings": described["settings"],
        "environment": described["environment"],
        "startup_s": round(peer.startup_s, 1),
        "warm_up_s": round(peer.warm_s, 1),
        "ours_x_vllm": ratios,
    }
    text = (
        f"vLLM {record['version']} (CPU build, its own environment .venv-vllm, the same process as our rungs): "
        f"settings {json.dumps(record['settings'])}; environment {json.dumps(record['environment'])}; the same "
        "chat-templated prompts as token ids, the same JSON schemas and Lark grammars (llguidance, our JSON layout), "
        "greedy, P(yes) from first-token log-probabilities, likelihoods from prompt log-probabilities. Start-up "
        f"{record['startup_s']} s (load{' and compile' if not args.vllm_eager else ''}) and warm-up "
        f"{record['warm_up_s']} s (the standard workload and one sample of the embedded design, as ours) untimed; "
        "its prefix cache emptied before every timed run, as each of our runs starts with an empty prefix store. "
        "Our full engine against vLLM (samples/s over samples/s): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        + "."
    )
    return text, record


class Peer:
    """The vLLM engine, started once before the ladder: its start-up (load, compile, first grammars) timed apart."""

    def __init__(self, engine, startup_s: float, warm_s: float):
        self.engine, self.startup_s, self.warm_s = engine, startup_s, warm_s


def start_vllm(args, judge, inputs: list[dict], caps: dict, cfg: dict):
    """vLLM's engine on the same judge in the dtype ours computes in (float32 for the embedded judge, bfloat16 for a
    GGUF judge on a CPU with bfloat16 arithmetic), prefix caching on, warmed as ours (warm_up); None where the ladder
    runs no vLLM rung (vllm_absent says why). vLLM loads model directories: a GGUF judge's is --vllm-model, the
    directory `sumscore convert` writes from the same file."""
    if vllm_absent(args):
        return None
    from offline_sumscore.engine.vllm_engine import VLLMEngine

    started = time.perf_counter()
    # The judge ours loaded, by its path: a bare --model means the embedded judge to the ladder, the default judge to
    # the loader, and the two engines must never run different judges.
    engine = VLLMEngine(args.vllm_model or judge.path, dtype=judge.dtype, enforce_eager=args.vllm_eager)
    startup = time.perf_counter() - started
    started = time.perf_counter()
    SummarizationScorer(engine=engine, **caps).score_many(inputs, on_error="return")  # the whole workload, as ours
    design = dict(key_sentences=cfg["questions"], claims="sentences", coverage="key_sentences", verdicts="likelihood")
    SummarizationScorer(engine=engine, **design).score_many(inputs[:1], on_error="return")
    return Peer(engine, startup, time.perf_counter() - started)
