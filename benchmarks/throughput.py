"""Throughput ladder: one process, one loaded judge, the same frozen inputs, each rung adding one feature.

    python benchmarks/throughput.py --config cpu --data DATA/summeval_dev.jsonl   # embedded judge (about 10 min here)
    python benchmarks/throughput.py --config gpu --tokenizer DIR   # Llama-3.1-8B geometry, random bf16 weights
    python benchmarks/throughput.py --config cpu --dtype bfloat16 --rungs 7,0 --shared-rungs ''
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
to benchmarks/results/ and prints the JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from offline_sumscore import SummarizationScorer  # noqa: E402
from offline_sumscore.core.stages import StageResult  # noqa: E402
from offline_sumscore.engine import Engine  # noqa: E402
from offline_sumscore.engine.local import EngineFeatures, TransformersEngine  # noqa: E402
from offline_sumscore.engine.local.kv_slots import KVGeometry  # noqa: E402
from offline_sumscore.engine.local.lab import LabSettings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

CONFIGS = {
    # Caps keep the embedded judge's degenerate repetition to a realistic length.
    "cpu": dict(
        samples=6,
        questions=3,
        text_chars=80,
        reason_chars=60,
        source_chars=1200,
        reference_samples=6,
        shared_docs=3,
        per_doc=4,
        shared_reference_samples=4,
    ),
    # Random weights write to every cap, so the caps set the load; they are sized so that the whole ladder fits a
    # single 10-minute device call (15 minutes of GPU a session). Rungs 0 and 1 run on the first 2 samples only:
    # the naive loop decodes every token at batch 1. Rates are per sample, so rungs compare across sample counts.
    "gpu": dict(
        samples=48,
        questions=6,
        text_chars=60,
        reason_chars=40,
        source_chars=3000,
        reference_samples=2,
        shared_docs=8,
        per_doc=6,
        shared_reference_samples=2,
    ),
}


# -- reference rungs: outlines' own generators behind the engine door -------------------------------------------
class OutlinesEngine(Engine):
    """Rungs 0 and 1: outlines.Generator with a prebuilt llguidance processor per schema (the same grammar our
    engine uses), called once per prompt (batch=False) or once per schema per wave (batch=True)."""

    def __init__(self, judge, *, batch: bool):
        import outlines

        self.judge, self.batch = judge, batch
        # Batched generate appends on the right, so its prompts are padded on the left, with a pad token.
        judge.tokenizer.padding_side = "left"
        if judge.tokenizer.pad_token_id is None:
            judge.tokenizer.pad_token = judge.tokenizer.eos_token
        self.model = outlines.from_transformers(judge.model, judge.tokenizer)
        self.grammars = judge.grammars()  # the same compiled grammars our engine uses
        self.generators: dict[str, object] = {}
        self.prefill_tokens = self.decoded_tokens = self.forward_passes = 0

    def describe(self) -> dict:
        return {"engine": "outlines-batch" if self.batch else "outlines-loop", "judge": self.judge.describe()}

    def _generator(self, grammar: tuple[str, str]):
        import outlines

        if grammar not in self.generators:
            self.generators[grammar] = outlines.Generator(self.model, processor=self.grammars.processor(grammar))
        return self.generators[grammar]

    def run(self, requests):
        from outlines.inputs import Chat

        from offline_sumscore.core.schemas import max_json_chars, parse_output

        results: list[StageResult | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            if r.continuation is not None:
                raise SystemExit("the outlines reference rungs generate; they cannot run likelihood requests")
            groups.setdefault(r.grammar, []).append(i)
        tok = self.judge.tokenizer
        for grammar, members in groups.items():
            gen = self._generator(grammar)
            cap = max_json_chars(json.loads(requests[members[0]].schema_json)) + 8
            calls = [members] if self.batch else [[i] for i in members]
            for call in calls:
                chats = [Chat(list(requests[i].messages)) for i in call]
                texts = (
                    gen.batch(chats, max_new_tokens=cap, do_sample=False)
                    if self.batch
                    else [gen(chats[0], max_new_tokens=cap, do_sample=False)]
                )
                longest = 0
                for i, text in zip(call, texts):
                    prompt = self.judge.render(requests[i].messages)
                    n_in = len(tok(prompt, add_special_tokens=False)["input_ids"])
                    n_out = len(tok(text, add_special_tokens=False)["input_ids"]) + 1  # + end of sequence
                    self.prefill_tokens += n_in
                    self.decoded_tokens += n_out
                    longest = max(longest, n_out)
                    res = StageResult(
                        request=requests[i],
                        value=None,
                        raw_output=text,
                        prompt=prompt,
                        tokens_in=n_in,
                        tokens_out=n_out,
                        decoded_tokens=n_out,
                    )
                    try:
                        res.value = parse_output(requests[i].schema, text)
                    except Exception as exc:  # noqa: BLE001 - recorded, as the real engine records it
                        res.error = f"output does not match the schema: {str(exc).splitlines()[0]}"
                    results[i] = res
                self.forward_passes += longest  # one prefill pass plus one pass per further token
        return results


# -- the machine's peaks ---------------------------------------------------------------------------------------
def measure_peaks(device: torch.device, dtype: torch.dtype) -> dict:
    """Best-of-3 matmul FLOP/s and copy bytes/s on this device, in the judge's dtype."""
    # float16 on a CPU is mostly emulated: a smaller matmul measures the same peak. bfloat16 runs on AMX/AVX512-BF16
    # units where the CPU has them, and needs the full size to reach its peak.
    n = 4096 if device.type == "cuda" else 256 if dtype == torch.float16 else 1024
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    big = torch.empty(int(2**30 if device.type == "cuda" else 2**28) // 4, device=device, dtype=torch.float32)

    def timed(fn, reps):
        best = float("inf")
        for _ in range(3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t) / reps)
        return best

    mm = timed(lambda: a @ b, 10)
    copy = timed(lambda: big.clone(), 5)
    return {
        "flops_per_s": 2 * n**3 / mm,
        "bytes_per_s": 2 * big.numel() * 4 / copy,
        "matmul_n": n,
        "dtype": str(dtype).replace("torch.", ""),
    }


def physical_floor(judge, peaks, processed_tokens, read_tokens, forward_passes, avg_context) -> float:
    cfg = judge.model.config
    # The decoder's weights run for every token; the vocabulary projection only where a token is read. A tied
    # head shares the embedding matrix but is still read from memory on every pass.
    body = sum(p.numel() for n, p in judge.model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    # A packed linear's dense weight was released (cpu_gemm.pack_linears): count it from its features.
    head = judge.model.get_output_embeddings()
    released = [
        m for m in judge.model.modules() if isinstance(m, torch.nn.Linear) and m.weight is None and m is not head
    ]
    body += sum(m.in_features * m.out_features for m in released)
    elem = judge.model.dtype.itemsize
    lm_head = cfg.hidden_size * cfg.vocab_size
    params = body + lm_head
    flops = 2 * body * processed_tokens + 2 * lm_head * read_tokens
    kv_per_token = KVGeometry.of(cfg, judge.model.dtype).bytes_per_token
    bytes_ = params * elem * forward_passes + kv_per_token * avg_context * read_tokens
    return max(flops / peaks["flops_per_s"], bytes_ / peaks["bytes_per_s"])


# -- inputs ----------------------------------------------------------------------------------------------------
def ladder_caps(cfg: dict) -> dict:
    """The scorer options every generating rung runs with (the ladder's workload): the summary's sentences as
    claims, questions drawn from the source, yes-no verdicts, each bounded by the config."""
    return dict(
        claims="sentences",
        coverage="questions",
        verdicts="yes-no",
        max_questions=cfg["questions"],
        max_text_chars=cfg["text_chars"],
        max_reason_chars=cfg["reason_chars"],
    )


def frozen_inputs(path: Path, n: int, source_chars: int) -> list[dict]:
    """The first n items of a JSONL file with source/summary, one summary per document, sources cut at a sentence
    end near source_chars (so the CPU run fits its time box). Without a file (path None), or past its end, the
    bundled demo set, repeated: the table's heading says which (inputs_note)."""
    rows: list[dict] = []
    if path is not None:
        seen = set()
        for line in path.open():
            item = json.loads(line)
            doc = item["id"].split(":")[1] if ":" in item["id"] else item["id"]
            if doc in seen:
                continue
            seen.add(doc)
            source = item["source"]
            if len(source) > source_chars:
                cut = source.rfind(". ", 0, source_chars)
                source = source[: cut + 1] if cut > 0 else source[:source_chars]
            rows.append({"id": item["id"], "source": source, "summary": item["summary"]})
            if len(rows) == n:
                break
    if len(rows) < n:
        demo = Path(__file__).resolve().parent.parent / "offline_sumscore" / "examples" / "demo.jsonl"
        base = [json.loads(line) for line in demo.open()]
        while len(rows) < n:
            item = dict(base[len(rows) % len(base)])
            item["id"] = f"{item['id']}-{len(rows)}"
            rows.append(item)
    return rows


def inputs_note(path: Path | None) -> str:
    """What the ladder ran on, for its table and JSON: a ladder on the demo rows measures three short texts again and
    again, and must say so."""
    if path is None:
        return "the three bundled demo rows, repeated (no --data given: not comparable with a ladder on real data)"
    return str(path)


def shared_inputs(path: Path, docs: int, per_doc: int, source_chars: int) -> list[dict]:
    """per_doc summaries of each of the first docs documents with that many (ids "system:doc"), sources cut as in
    frozen_inputs. Without a file, the bundled demo set, each source paired with every demo summary."""
    by_doc: dict[str, list[dict]] = {}
    if path is not None:
        for line in path.open():
            item = json.loads(line)
            doc = item["id"].split(":")[1] if ":" in item["id"] else item["id"]
            by_doc.setdefault(doc, []).append(item)
    chosen = [items[:per_doc] for items in by_doc.values() if len(items) >= per_doc][:docs]
    if len(chosen) < docs:
        demo = Path(__file__).resolve().parent.parent / "offline_sumscore" / "examples" / "demo.jsonl"
        base = [json.loads(line) for line in demo.open()]
        chosen = [
            [dict(b, source=base[d % len(base)]["source"], id=f"{b['id']}:{d}") for b in (base * per_doc)[:per_doc]]
            for d in range(docs)
        ]
    rows = []
    for items in chosen:
        source = items[0]["source"]
        if len(source) > source_chars:
            cut = source.rfind(". ", 0, source_chars)
            source = source[: cut + 1] if cut > 0 else source[:source_chars]
        rows.extend({"id": item["id"], "source": source, "summary": item["summary"]} for item in items)
    return rows


def verdicts(result) -> list[bool]:
    if getattr(result, "error", None):
        return []
    return [c["supported"] for c in result.claims] + [v["answered"] for v in result.coverage_verdicts]


def flip_rate(base, other) -> float:
    flips = total = 0
    for a, b in zip(base, other):
        va, vb = verdicts(a), verdicts(b)
        total += max(len(va), len(vb))
        flips += sum(x != y for x, y in zip(va, vb)) + abs(len(va) - len(vb))
    return flips / total if total else 0.0


# -- the ladder ------------------------------------------------------------------------------------------------
def load(
    config: str,
    tokenizer_dir: str | None,
    model: str | None,
    layers: int = 32,
    allow_cpu: bool = False,
    vocab: int = 128256,
    dtype: str | None = None,
):
    from offline_sumscore.engine.judge import Judge, load_judge, models_root

    if config == "cpu":
        return load_judge(model or "smollm2-135m", dtype=dtype or "auto")
    # GPU: Llama-3.1-8B's geometry with random weights. Throughput does not depend on weight values.
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else None
    if device is None and not allow_cpu:
        raise SystemExit("--config gpu needs a CUDA device (--allow-cpu with --layers 2 checks the code path here)")
    device = device or "cpu"
    tok_dir = tokenizer_dir or str(models_root() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    tokenizer.padding_side = "left"
    own = len(tokenizer)
    if vocab > own:
        # Llama-3's vocabulary is 128,256 tokens; SmolLM2's tokenizer has 49,152. Reserved tokens fill the rest, so
        # that every per-vocabulary cost (grammar masks, their transfer, the head, softmax) is paid at full width.
        tokenizer.add_tokens([f"<|reserved_{i}|>" for i in range(vocab - own)], special_tokens=True)
    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=max(128256, len(tokenizer)) if vocab else len(tokenizer),  # --vocab 0: the tokenizer's own
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # bfloat16 as on the GPU; a CPU check runs float32 unless told otherwise: without bfloat16 units the CPU
    # emulates it, and one forward pass of the one-layer model took seconds.
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    torch.set_default_dtype(getattr(torch, dtype))
    with torch.device(device), _no_init_weights():
        hf_model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    random_weights(hf_model)
    hf_model.eval()
    hf_model.generation_config.eos_token_id = tokenizer.eos_token_id
    return Judge(
        model=hf_model,
        tokenizer=tokenizer,
        name=f"random-llama-3.1-8b-geometry-{layers}-layers",
        path="(random)",
        device=device,
        dtype=dtype,
        identity="random",
        context_length=8192,
        decisions={
            "weights": f"random, Llama-3.1-8B geometry ({layers} layers, 4096 hidden, GQA 8); "
            f"tokenizer SmolLM2's, {own} tokens, padded with reserved tokens to "
            f"{len(tokenizer)} (grammar masks span them all); a {cfg.vocab_size}-row head"
        },
    )


def _no_init_weights():
    """transformers' switch that leaves weights uninitialised (random_weights fills them): its home moved in 5.x."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def random_weights(model, std: float = 0.02, period: int = 65521) -> None:
    """Every matrix filled with one seeded block of normal(0, std) values, tiled (the block's length is prime, so
    rows do not repeat in step). Throughput does not depend on the values, only on their being finite; drawing
    a normal value for each of an 8B geometry's weights on a CPU took minutes (a one-layer model with Llama-3's
    128k-token embedding and head: over 3 minutes on the 2-core machine), a tiled copy takes about a second.
    Vectors (the norms' weights) keep the ones they were built with."""
    block = torch.randn(period, generator=torch.Generator().manual_seed(0)) * std
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() < 2:
                continue
            flat = param.view(-1)
            tile = block.to(device=param.device, dtype=param.dtype)
            whole = flat.numel() // period
            flat[: whole * period].view(whole, period).copy_(tile.expand(whole, period))
            flat[whole * period :] = tile[: flat.numel() - whole * period]


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
        default="7,0,1,2,3,4,5,6,7a,7b,8,V,V8",
        help="in the order run: the full engine first, so a run cut short still has it",
    )
    ap.add_argument(
        "--shared-rungs", default="0,1,5,6,7a,7,V", help="rungs run on the shared-source workload ('' for none)"
    )
    ap.add_argument("--bulk", type=int, default=100, help="samples in the bulk workload (0: none)")
    ap.add_argument("--bulk-rungs", default="7,V", help="rungs run on the bulk workload")
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
    peer = start_vllm(args, inputs, caps, cfg)
    ladder = ladder_rungs(judge, caps, cfg, peer)
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
    if peer is None:  # no vLLM here (vllm_absent says why): its rungs are left out, and the report says so
        workloads = {
            w: (items, ref, [r for r in rungs if not r.startswith("V")]) for w, (items, ref, rungs) in workloads.items()
        }
    args.peer = peer
    markdown, report = run_ladder(args, cfg, judge, peaks, inputs, ladder, workloads)
    print(markdown)
    print(json.dumps(report))


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


def ladder_rungs(judge, caps: dict, cfg: dict, peer=None) -> dict:
    """Each rung: its label, how its engine is made, the scorer's options. peer: the started vLLM engine, or None."""
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
    return ladder


class Peer:
    """The vLLM engine, started once before the ladder: its start-up (load, compile, first grammars) timed apart."""

    def __init__(self, engine, startup_s: float, warm_s: float):
        self.engine, self.startup_s, self.warm_s = engine, startup_s, warm_s


def start_vllm(args, inputs: list[dict], caps: dict, cfg: dict):
    """vLLM's engine on the same judge, float32, prefix caching on, warmed as ours (warm_up); None where
    the ladder runs no vLLM rung (vllm_absent says why)."""
    if vllm_absent(args):
        return None
    from offline_sumscore.engine.vllm_engine import VLLMEngine

    started = time.perf_counter()
    engine = VLLMEngine(args.model, dtype="float32", enforce_eager=args.vllm_eager)
    startup = time.perf_counter() - started
    started = time.perf_counter()
    SummarizationScorer(engine=engine, **caps).score_many(inputs, on_error="return")  # the whole workload, as ours
    design = dict(key_sentences=cfg["questions"], claims="sentences", coverage="key_sentences", verdicts="likelihood")
    SummarizationScorer(engine=engine, **design).score_many(inputs[:1], on_error="return")
    return Peer(engine, startup, time.perf_counter() - started)


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


def nan_count(results) -> int:
    """NaN anywhere a verdict's number lands (each stage's P(yes), each claim's and coverage item's P(yes) and
    PMI, the scores): a poisoned attention row shows up here even where the JSON stays valid."""

    def nan(v) -> bool:
        return isinstance(v, float) and v != v

    count = 0
    for r in results:
        for audit in (getattr(r, "stages", None) or {}).values():
            count += sum(map(nan, audit.get("p_yes") or []))
        for item in (getattr(r, "claims", None) or []) + (getattr(r, "coverage_verdicts", None) or []):
            count += sum(nan(item.get(k)) for k in ("p_supported", "p_answered", "pmi"))
        count += sum(
            nan(getattr(r, name, None))
            for name in ("score", "alignment", "coverage", "soft_alignment", "soft_coverage")
        )
    return count


def derive(cfg, judge, peaks, rows, outputs, ladder_order) -> tuple[list[dict], float | None, dict | None]:
    """Each row's flip rate against rung 0 and its ratios; the standard workload's physical floor and the rung it
    was taken from. Returns the rows in ladder order, the floor per sample and that rung's row."""
    workloads = ("standard", "shared", "bulk")
    order = {rung: k for k, rung in enumerate(ladder_order)}
    rows = sorted(rows, key=lambda r: (workloads.index(r["workload"]), order[r["rung"]]))
    for row in rows:
        done = outputs[row["workload"]]
        # Rungs 7b and 8 judge otherwise (no reasons; other items): no flip rate against rung 0.
        row["flip_rate_vs_rung0"] = (
            flip_rate(done["0"], done[row["rung"]]) if "0" in done and row["rung"] not in ("7b", "8", "V8") else None
        )
        # vLLM's rungs against our full engine on the same design: the verdicts that differ, and the time ratio.
        ours = OURS_FOR.get(row["rung"])
        row["flip_rate_vs_ours"] = flip_rate(done[ours], done[row["rung"]]) if ours in done else None
    # One floor for the standard workload: the least work that gives the same verdicts, i.e. the token and pass
    # counts of the rung that ran the fewest tokens per sample (rungs 0 and 1 may run fewer samples than the
    # others). Every standard rung's time is set against it.
    standard = [r for r in rows if r["workload"] == "standard" and r["rung"] not in ("7b", "8", "V", "V8")]
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


OURS_FOR = {"V": "7", "V8": "8"}  # each vLLM rung's counterpart: our full engine on the same design


def bulk_inputs(path: Path, n: int, source_chars: int) -> list[dict]:
    """n samples as a bulk run meets them: every document's first summary, then every document's second, and so on
    (SummEval dev: 58 documents, 12 summaries each), sources cut as in frozen_inputs."""
    if not n:
        return []
    by_doc: dict[str, list[dict]] = {}
    if path is not None:
        for line in path.open():
            item = json.loads(line)
            by_doc.setdefault(item["id"].split(":")[1] if ":" in item["id"] else item["id"], []).append(item)
    rows = []
    for depth in range(max((len(v) for v in by_doc.values()), default=0)):
        rows += [items[depth] for items in by_doc.values() if depth < len(items)]
    rows = rows[:n] or frozen_inputs(path, n, source_chars)
    for row in rows:
        if len(row["source"]) > source_chars:
            cut = row["source"].rfind(". ", 0, source_chars)
            row["source"] = row["source"][: cut + 1] if cut > 0 else row["source"][:source_chars]
    return [{"id": r["id"], "source": r["source"], "summary": r["summary"]} for r in rows]


def vllm_absent(args) -> str | None:
    """Why the ladder runs no vLLM rung, in a sentence; None where it runs them."""
    import importlib.util

    if not any(r.startswith("V") for r in f"{args.rungs},{args.shared_rungs},{args.bulk_rungs}".split(",")):
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


def write_report(args, cfg, judge, peaks, inputs, rows, outputs, ladder_order) -> tuple[str, dict]:
    """Ratios, the floor, the table, in ladder order; written after every rung, so a run cut short keeps what it
    measured. Returns the markdown and the report."""
    rows, floor_per_sample, least = derive(cfg, judge, peaks, rows, outputs, ladder_order)
    vllm, vllm_record = peer_note(args, rows)
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
        f"{sync_note}\n\n" + "\n".join(table) + f"\n\n{vllm}\n" + profile_table(rows)
    )
    out = args.out or RESULTS / f"throughput_{args.config}"
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n")
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
        if r["rung"] not in ("7", "8", "V", "V8"):
            continue
        cached = r["cached_prompt_tokens"] if r.get("cached_prompt_tokens") is not None else r["stored_tokens"]
        per = 1000 * r["seconds"] / max(1, r["forward_passes"])
        lines.append(
            f"| {r['workload']} | {r['rung']} | {r['prefill_tokens']} | {cached} | {r['forced_tokens']} | "
            f"{r['decoded_tokens']} | {r['forward_passes']} | {per:.0f} |"
        )
    return "\n".join(lines) + "\n"


def row_outcomes(outputs: dict) -> dict:
    """Every rung's rows as their outcomes (score, each verdict and its probability, or the error): what two runs of
    the ladder, before and after a change, compare with research/compare_ladders.py."""

    def outcome(result) -> dict:
        if getattr(result, "error", None):
            return {"id": result.id, "error": result.error.get("cause")}
        return {
            "id": result.id,
            "score": result.score,
            "verdicts": verdicts(result),
            "p": [c.get("p_supported") for c in result.claims]
            + [v.get("p_answered") for v in result.coverage_verdicts],
        }

    return {
        workload: {rung: [outcome(r) for r in results] for rung, results in rungs.items()}
        for workload, rungs in outputs.items()
    }


if __name__ == "__main__":
    main()
