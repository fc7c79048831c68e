"""Tokens a pass on a CPU: how fast the judge's decoder runs by pass size, and the engine at bulk under several caps
on a pass's tokens (lab's pass_tokens; vLLM's max_num_batched_tokens), in turns.

    python -m research.pass_tokens --data DATA/summeval_dev.jsonl --values 1000000,4096,2048,1024 --samples 40

Without a cap, the engine's first step at bulk feeds every admitted row's whole prompt at once: on the 40-sample
bulk workload one pass of 14,311 tokens, a third of the run's time. (1) The bare decoder (its linears prepacked, as
the engine runs them) on rows of 360 tokens, 2 to 40 rows a call, twice in turns: tokens per second by pass size.
(2) The full engine on the bulk workload under each cap, the caps in turns (bulk_turns.py's in_turns, as row_cap.py
runs them), with its verdicts against the first cap's; 1000000 is no cap. Writes results/pass_tokens.md (--name).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from offline_sumscore.engine.local import EngineFeatures, TransformersEngine
from offline_sumscore.engine.local.lab import LabSettings
from research.bulk_turns import in_turns, turns_parser, turns_table, warm_bulk
from research.tables import publish

HERE = Path(__file__).resolve().parent

ROW_TOKENS = 360  # about a bulk prompt's length
ROWS = (40, 16, 8, 4, 2)


def decoder_rates(judge, rounds: int = 2) -> dict[int, list[float]]:
    """Tokens per second of the bare decoder by rows a call (ROW_TOKENS each), about 40 rows' worth a measurement."""
    decoder = judge.model.model
    rates: dict[int, list[float]] = {rows: [] for rows in ROWS}
    with torch.inference_mode():
        for turn in range(rounds):
            for rows in ROWS if turn % 2 == 0 else ROWS[::-1]:
                ids = torch.zeros((rows, ROW_TOKENS), dtype=torch.long)
                decoder(input_ids=ids, use_cache=False)  # a first call of each shape builds oneDNN's primitives
                calls = max(1, 40 // rows)
                started = time.perf_counter()
                for _ in range(calls):
                    decoder(input_ids=ids, use_cache=False)
                rates[rows].append(rows * ROW_TOKENS * calls / (time.perf_counter() - started))
    return rates


def engine_for(judge):
    def make(pass_tokens: int) -> TransformersEngine:
        return TransformersEngine(judge, lab=LabSettings(features=EngineFeatures(), pass_tokens=pass_tokens))

    return make


def main() -> None:
    ap = turns_parser(__doc__.splitlines()[0], samples=40, name="pass_tokens")
    ap.add_argument("--values", default="1000000,4096,2048,1024")
    args = ap.parse_args()
    values = [int(v) for v in args.values.split(",")]
    judge, inputs, options = warm_bulk(args.data, args.samples)
    rates = decoder_rates(judge)
    runs = in_turns(values, engine_for(judge), inputs, options, args.repeats, "pass_tokens")
    lines = [
        f"# Tokens a pass on a CPU (torch threads {torch.get_num_threads()})",
        "",
        f"## The bare decoder by pass size (rows of {ROW_TOKENS} tokens, linears prepacked; two turns)",
        "",
        "| rows a call | tokens a pass | tokens/s, each turn |",
        "|---|---|---|",
        *(f"| {rows} | {rows * ROW_TOKENS} | {' / '.join(f'{r:.0f}' for r in rates[rows])} |" for rows in ROWS),
        "",
        f"## The full engine on the bulk workload ({len(inputs)} samples, {args.repeats} runs a cap, in turns)",
        "",
        *turns_table(runs, values, len(inputs), "tokens a pass at most"),
    ]
    publish(args.name, lines)


if __name__ == "__main__":
    main()
