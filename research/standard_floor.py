"""The standard workload's time against what no engine can cut: the prompts' least work, and the projections' cost at
the size of each pass the run makes.

    python -m research.standard_floor --data DATA/summeval_dev.jsonl

Issue 38 asks for our full engine at 1.2x vLLM on the ladder's standard workload (6 samples). This prices one run of
rung 7 three ways, twice in turns (the machine's speed swings by a tenth within minutes):
(1) tokens: the prompts' unique-prefix count (a trie over every request's rendered prompt, the least any prefix cache
    could compute: vLLM's, ours, one yet to be built) against the prompt tokens the engine computed;
(2) the passes: the decoder's 210 projections, on weights prepacked as the engine packs them, timed at every token
    count the run's passes carry and summed over its passes; then the same tokens at the best per-token rate measured
    (the widest pass): what the small passes of the dependency chain cost beyond their arithmetic;
(3) the rest: the time inside the passes that is not the projections (attention, norms, KV writes), and the time
    outside them (the vocabulary projection at read points, picks, masks, admission, the scorers).
Then the ladder's last standard ratio (benchmarks/results/throughput_cpu.json) against the cut 1.2x would need,
and what each part could give at most. Writes results/standard_floor.md (--name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from research.tables import publish

HERE = Path(__file__).resolve().parent

LADDER = HERE.parent / "benchmarks" / "results" / "throughput_cpu.json"


def unique_prefix_tokens(prompts: list[list[int]]) -> int:
    """Tokens in a trie of the prompts: what remains to compute when every shared prefix is computed once."""
    root: dict = {}
    count = 0
    for ids in prompts:
        node = root
        for token in ids:
            if token not in node:
                node[token] = {}
                count += 1
            node = node[token]
    return count


def one_run(judge, inputs: list[dict], ladder: dict) -> dict:
    """Rung 7 once: its wall, every timed pass, every prompt it was asked (rows_for, seen from outside)."""
    from offline_sumscore import SummarizationScorer
    from offline_sumscore.engine.local import admission
    from offline_sumscore.engine.local import engine as engine_module

    prompts: list[list[int]] = []
    original = admission.rows_for

    def spy(judge_, ready):
        rows = original(judge_, ready)
        prompts.extend(list(row.prompt_ids) for row in rows)
        return rows

    make, options = ladder["7"][1:]
    timings: list = []
    engine = make(on_timing=timings.append)
    engine_module.rows_for = spy
    try:
        started = time.perf_counter()
        SummarizationScorer(engine=engine, **options).score_many(inputs, on_error="return")
        wall = time.perf_counter() - started
    finally:
        engine_module.rows_for = original
    passes = [t for t in timings if t.kind != "masks"]
    s = engine.stats
    return {
        "wall": wall,
        "pass_tokens": [t.tokens for t in passes],
        "in_passes": sum(t.seconds for t in passes),
        "computed_prompt": s.prefill_tokens,
        "forced": s.forced_tokens,
        "decoded": s.decoded_tokens,
        "prompts": prompts,
    }


def projection_ms(judge, counts: list[int], repeats: int = 3) -> dict[int, float]:
    """Median ms of the decoder's projections (every nn.Linear under the decoder, prepacked) at each token count."""
    linears = [m for m in judge.model.model.modules() if isinstance(m, torch.nn.Linear)]
    out: dict[int, float] = {}
    with torch.inference_mode():
        for n in counts:
            inputs = {k: torch.randn(n, k) for k in {m.in_features for m in linears}}
            for m in linears:  # the first call of a shape builds oneDNN's primitive
                m(inputs[m.in_features])
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                for m in linears:
                    m(inputs[m.in_features])
                times.append((time.perf_counter() - started) * 1e3)
            out[n] = statistics.median(times)
    return out


def priced(run: dict, ms: dict[int, float]) -> dict:
    tokens = run["pass_tokens"]
    at_sizes = sum(ms[n] for n in tokens) / 1e3
    best = min(ms[n] / n for n in ms)  # ms a token at the most efficient count measured
    return {
        "projections": at_sizes,
        "projections_best_rate": sum(tokens) * best / 1e3,
        "best_ms_per_token": best,
        "rest_in_passes": run["in_passes"] - at_sizes,
        "outside": run["wall"] - run["in_passes"],
    }


def ladder_ratio() -> tuple[float, float, float] | None:
    if not LADDER.exists():
        return None
    rows = {r["rung"]: r for r in json.loads(LADDER.read_text())["rows"] if r["workload"] == "standard"}
    if "7" not in rows or "V" not in rows:
        return None
    return rows["7"]["seconds"], rows["V"]["seconds"], rows["V"]["seconds"] / rows["7"]["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="summeval_dev.jsonl (the ladder's inputs)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--name", default="standard_floor")
    args = ap.parse_args()

    from benchmarks.lib.ladder import ladder_rungs
    from benchmarks.lib.workloads import CONFIGS, frozen_inputs, ladder_caps
    from offline_sumscore import SummarizationScorer, load_judge

    cfg = CONFIGS["cpu"]
    judge = load_judge("smollm2-135m")
    inputs = frozen_inputs(args.data, cfg["samples"], cfg["source_chars"])
    caps = ladder_caps(cfg)
    ladder = ladder_rungs(judge, caps, cfg)
    make, options = ladder["7"][1:]
    SummarizationScorer(engine=make(), **options).score_many(inputs[:1], on_error="return")  # grammars, kernels

    rounds = []
    for k in range(args.rounds):
        run = one_run(judge, inputs, ladder)
        ms = projection_ms(judge, sorted(set(run["pass_tokens"])))
        rounds.append((run, priced(run, ms)))
        print(f"round {k + 1}: wall {run['wall']:.2f} s, {len(run['pass_tokens'])} passes", flush=True)

    run = rounds[0][0]
    prompt_total = sum(len(p) for p in run["prompts"])
    least = unique_prefix_tokens(run["prompts"])
    lines = [
        "# The standard workload against what no engine can cut",
        "",
        f"Command: `python -m research.standard_floor --data .../summeval_dev.jsonl` (rung 7, {len(inputs)} samples,"
        f" {args.rounds} rounds in turns with the projections' timing; the embedded judge, float32, on the CPU).",
        "",
        "## Tokens",
        "",
        f"- Requests: {len(run['prompts'])}; their prompts hold {prompt_total:,} tokens.",
        f"- The prompts' unique-prefix count (every shared prefix once): **{least:,}**.",
        f"- Prompt tokens the engine computed: **{run['computed_prompt']:,}** ({run['computed_prompt'] - least:+,}"
        f" against the least), then {run['forced']} forced and {run['decoded']} decoded.",
        "",
        "## Where a run's time goes, priced",
        "",
        "| round | wall s | passes | in the passes s | projections at the passes' sizes s | the same tokens at"
        " the best rate s | best ms a token | rest inside the passes s | outside the passes s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, (r, p) in enumerate(rounds, 1):
        lines.append(
            f"| {k} | {r['wall']:.2f} | {len(r['pass_tokens'])} | {r['in_passes']:.2f} | {p['projections']:.2f} |"
            f" {p['projections_best_rate']:.2f} | {p['best_ms_per_token']:.3f} | {p['rest_in_passes']:.2f} |"
            f" {p['outside']:.2f} |"
        )
    sizes = sorted(rounds[0][0]["pass_tokens"])
    lines += [
        "",
        f"Pass sizes (tokens): {', '.join(str(n) for n in sizes)}.",
        "",
        "The projections at the passes' sizes less the same tokens at the best rate is what the small passes cost"
        " beyond their arithmetic; the rest inside the passes is attention, norms, rotary embedding and KV writes.",
    ]
    ladder = ladder_ratio()
    if ladder:
        ours, theirs, ratio = ladder
        need = 1 - ratio / 1.2
        walls = [r["wall"] for r, _ in rounds]
        wall = statistics.median(walls)
        shares = {
            "outside the passes": statistics.median(p["outside"] for _, p in rounds) / wall,
            "inside the passes, not the projections": statistics.median(p["rest_in_passes"] for _, p in rounds) / wall,
            "the small passes' excess": statistics.median(
                p["projections"] - p["projections_best_rate"] for _, p in rounds
            )
            / wall,
            # priced at the best rate: the dearest a computed token can be is the rest of its pass, counted above
            "prompt tokens above the least": (run["computed_prompt"] - least)
            * statistics.median(p["best_ms_per_token"] for _, p in rounds)
            / 1e3
            / wall,
        }
        lines += [
            "",
            "## Against the ladder",
            "",
            f"The last ladder run (`benchmarks/results/throughput_cpu.json`): ours {ours:.2f} s, vLLM's"
            f" {theirs:.2f} s, {ratio:.2f}x. 1.2x needs our wall {need:.0%} shorter. Each part's share of this"
            " script's wall (median round), the most that cutting it to nothing could give:",
            "",
            "| part | share of the wall |",
            "|---|---|",
        ]
        lines += [f"| {name} | {share:.1%} |" for name, share in shares.items()]
    publish(args.name, lines)


if __name__ == "__main__":
    main()
