"""Throughput ladder: one process, one loaded judge, the same frozen inputs, each rung adding one feature.

    python -m benchmarks.throughput --config cpu --data DATA/summeval_dev.jsonl   # embedded judge (about 10 min here)
    python -m benchmarks.throughput --config gpu --tokenizer DIR   # Llama-3.1-8B geometry, random bf16 weights
    python -m benchmarks.throughput --config cpu --dtype bfloat16 --rungs 7,0 --shared-rungs ''
        # the judge in bfloat16 on a CPU with AMX/AVX512-BF16: the batched engine gains, batch-1 decoding loses, and
        # verdicts follow the batch shape (results/throughput_cpu_bfloat16.md: 23% flips against rung 0)

Rungs 0 to 7b run the two-axis metric in a design every rung can run, with something to decode: the summary's
sentences as claims, questions written by the judge (JSON), and one yes-no verdict with a decoded reason per claim
and per question (the design a brought judge uses, with sentences instead of atomic claims, which the 135M judge
cannot write):
  0  naive loop: one prebuilt outlines Generator per grammar, one call per prompt
  1  outlines Generator.batch per stage (one call per grammar per wave)
  2  our engine in waves: iteration-level batching across samples, in ragged passes (each row feeds only its own
     tokens; every token decoded, nothing shared)
  3  + shared prefixes (source / summary computed once per wave, its keys and values copied per request)
  4  + forced tokens (grammar-fixed text inserted in one forward pass, not decoded)
  5  + verdicts from logits (rows end when the grammar is complete; P(yes) read off the distribution)
  6  + one continuous stream (a sample's next wave joins the moment its own answers are in, not after the wave)
  7a + the prefix store (prefixes kept across waves and samples: a source computed once per run)
  7  + n-gram drafts (tokens guessed from the prompt, the row's output and earlier outputs of its grammar, checked
     in the same pass: speculative decoding without a draft model; the full engine)
  7b the full engine without reasons (include_reason=False): what a bulk run that needs only scores costs
  8  the embedded judge's own design (sentences, key sentences, likelihood verdicts) on the full engine: nothing
     decoded at all. Another workload, as 7b is: its verdicts are not comparable with rung 0's.
  V  vLLM (its CPU build, from .venv-vllm) on rung 7's workload; V8 on rung 8's: the peer, in the same process and
     run, started and warmed before the ladder (start-up reported apart). "flips vs ours": its verdicts against our
     full engine's on the same design.
  L  llama.cpp's llama-server (`make llamacpp-env`) on the judge's GGUF, rung 7's workload through --judge-url's
     engine, its --parallel chosen by measurement first (--llama-parallel); no L8 (it gives no likelihoods of a
     given text). Agreement with rung 7 on the same claims and scores (benchmarks/lib/llamacpp_peer.py).
Three workloads: "standard" (one summary per source, as the ladder always ran), "shared" (several summaries of each
source, as evaluation data comes: SummEval has 12 systems per document), each rung's ratios against rung 0 of the
same workload, and "bulk" (--bulk samples, 100 by default, every document's first summary, then its second: where
steady state dominates; our full engine and vLLM only). Run with .venv-vllm/bin/python for the vLLM rungs.
Prefill tokens per sample are counted for every rung (a source reused from the store counts zero).

Per rung: samples/s, questions/s, prefill/forced/decoded tokens per second, the ratio to rung 0 and to the
previous rung, the verdict flip rate against rung 0, and the rung's time as a percentage of the workload's physical
floor: max(FLOPs / peak FLOP/s, bytes / peak bytes/s) for the least work that gives these verdicts (the token and
forward-pass counts of the rung that ran the fewest tokens), FLOPs = 2 x weights x tokens run through the model
(attention scores left out: small at these lengths), bytes = weights read once per forward pass + KV cache read
per decoded token; the peaks are measured on this machine at the start (a matmul and a copy). Writes JSON and a
markdown table
to benchmarks/results/ and prints the JSON as its last line. This script reads the options and runs the ladder; the
ladder itself is in benchmarks/lib/ (workloads, ladder_judge, peaks, ladder, vllm_peer, ladder_report), which other
benchmarks and research scripts share.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.ladder import ladder_rungs, run_ladder, warm_up
from benchmarks.lib.ladder_judge import load
from benchmarks.lib.llamacpp_peer import start_llamacpp
from benchmarks.lib.peaks import measure_peaks
from benchmarks.lib.vllm_peer import start_vllm
from benchmarks.lib.workloads import CONFIGS, bulk_inputs, frozen_inputs, ladder_caps, shared_inputs


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Throughput ladder (see the module docstring).")
    ap.add_argument("--config", choices=list(CONFIGS), default="cpu")
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="JSONL with source/summary and ids <set>:<doc>:<system> (SummEval's agreement file is what the "
        "published ladders ran on); without it, the three bundled demo rows, repeated, and the table says so",
    )
    ap.add_argument("--model", default=None, help="cpu config: a judge other than the embedded one (smollm2-135m)")
    ap.add_argument("--tokenizer", default=None, help="gpu config: a directory with the tokenizer files")
    ap.add_argument(
        "--rungs",
        default="7,0,1,2,3,4,5,6,7a,7b,8,V,V8,L",
        help="in the order run: the full engine first, so a run cut short still has it",
    )
    ap.add_argument(
        "--shared-rungs", default="0,1,5,6,7a,7,V,L", help="rungs run on the shared-source workload ('' for none)"
    )
    ap.add_argument("--bulk", type=int, default=100, help="samples in the bulk workload (0: none)")
    ap.add_argument("--bulk-rungs", default="7,V,L", help="rungs run on the bulk workload")
    ap.add_argument(
        "--llama-parallel",
        default="1,2,4,8",
        help="llama-server's --parallel settings tried on the standard workload before the ladder; the fastest runs L",
    )
    ap.add_argument(
        "--vllm-model",
        default=None,
        help="the judge as a model directory for vLLM, where --model is a GGUF file (`sumscore convert FILE -o DIR` "
        "writes it from the same file); default: the judge our rungs load",
    )
    ap.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM without its compile (enforce_eager); default: compiled, its compile cache warmed before timing",
    )
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--questions", type=int, default=None)
    ap.add_argument("--shared-docs", type=int, default=None, help="shared workload: documents")
    ap.add_argument("--per-doc", type=int, default=None, help="shared workload: summaries per document")
    ap.add_argument("--layers", type=int, default=32, help="gpu config: decoder layers (32 is Llama-3.1-8B)")
    ap.add_argument("--allow-cpu", action="store_true", help="gpu config: run on the CPU (a code-path check only)")
    ap.add_argument(
        "--vocab",
        type=int,
        default=128256,
        help="gpu config: pad the tokenizer and the head to this many tokens (Llama-3's 128256; 0: the tokenizer's)",
    )
    ap.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="the judge's dtype (default: the loader's auto on the cpu config, float32; the gpu config's random model: "
        "bfloat16 on CUDA, float32 with --allow-cpu)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of the whole ladder; each rung's time is the median of its runs (default: 3 on cpu, 1 on gpu)",
    )
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    cfg = dict(CONFIGS[args.config])
    args.repeats = args.repeats or (3 if args.config == "cpu" else 1)
    if args.samples:
        cfg["samples"] = args.samples
    if args.questions:
        cfg["questions"] = args.questions
    if args.shared_docs:
        cfg["shared_docs"] = args.shared_docs
    if args.per_doc:
        cfg["per_doc"] = args.per_doc
    judge = load(args.config, args.tokenizer, args.model, args.layers, args.allow_cpu, args.vocab, args.dtype)
    peaks = measure_peaks(judge.model.device, judge.model.dtype)
    inputs = frozen_inputs(args.data, cfg["samples"], cfg["source_chars"])
    caps = ladder_caps(cfg)
    warm_up(
        judge,
        inputs,
        caps,
        cfg,
        with_outlines=bool({"0", "1"} & set(args.rungs.split(",") + args.shared_rungs.split(","))),
    )
    peer = start_vllm(args, judge, inputs, caps, cfg)
    args.llama_peer = start_llamacpp(args, judge, inputs, caps)
    ladder = ladder_rungs(judge, caps, cfg, peer, args.llama_peer)
    workloads = {
        "standard": (inputs, cfg["reference_samples"], args.rungs.split(",")),
        "shared": (
            shared_inputs(args.data, cfg["shared_docs"], cfg["per_doc"], cfg["source_chars"]),
            cfg["shared_reference_samples"],
            [r for r in args.shared_rungs.split(",") if r],
        ),
        "bulk": (
            bulk_inputs(args.data, args.bulk, cfg["source_chars"]),
            0,
            [r for r in args.bulk_rungs.split(",") if r],
        ),
    }
    if not args.bulk:
        del workloads["bulk"]
    # A peer not run here (vllm_absent, llamacpp_absent say why): its rungs are left out, and the report says so.
    absent = {"V": peer is None, "L": args.llama_peer is None}
    workloads = {
        w: (items, ref, [r for r in rungs if not absent.get(r[0])]) for w, (items, ref, rungs) in workloads.items()
    }
    args.peer = peer
    try:
        markdown, report = run_ladder(args, cfg, judge, peaks, inputs, ladder, workloads)
    finally:
        if args.llama_peer is not None:
            args.llama_peer.stop()
    print(markdown)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
