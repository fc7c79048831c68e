"""Keys and values held at bulk: the engine's KV slots against what a paged cache would hold for the same rows, and
so how many rows a KV budget fits either way.

    python -m research.kv_memory --data DATA/summeval_dev.jsonl --samples 40

The engine keeps one slot per row in rectangular buffers [slots, kv heads, columns, head dim] per layer: a slot is as
wide as the widest row, a shared prefix is copied into every row that uses it, and on a CPU the buffers take the
engine's row limit from the start. A paged cache (vLLM's PagedAttention with its prefix caching) holds each row in
16-token blocks, and a full block whose tokens and all tokens before it equal another row's is held once, by
reference. After every decoding step of one bulk run this counts, over the live rows:

- slots allocated: the buffers' rows x columns (what the process holds);
- slots spanned: the live span's rows x its widest row (what rectangular slots need at the least);
- paged: one block per distinct full block (keyed by its tokens and every token before it, as vLLM's prefix cache
  hashes them) plus each row's last, partial block.

Rows a budget fits: the budget over the tokens held per live row, at the step where the batch holds the most
rows. Writes results/kv_memory.md (--name). An accounting of the run's rows, not a paged cache: none is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.lib.workloads import CONFIGS, bulk_inputs
from offline_sumscore import SummarizationScorer, load_judge
from offline_sumscore.engine.local import TransformersEngine
from offline_sumscore.engine.local.kv_slots import KVGeometry
from offline_sumscore.engine.local.step import Stepper
from research.bulk_turns import bulk_options
from research.tables import publish

HERE = Path(__file__).resolve().parent

BLOCK = 16  # vLLM's default block size, and the prefix store's


def paged_tokens(rows) -> int:
    """Tokens a paged cache with prefix caching holds for these rows' computed tokens."""
    blocks, partial = set(), 0
    for row in rows:
        tokens = (row.prompt_ids + row.out)[: row.computed]
        full = len(tokens) // BLOCK
        key = ()
        for b in range(full):  # a block's key: its tokens and every block before it (a chain, as vLLM hashes)
            key = hash((key, tuple(tokens[b * BLOCK : (b + 1) * BLOCK])))
            blocks.add(key)
        partial += len(tokens) > full * BLOCK
    return (len(blocks) + partial) * BLOCK


def account(batch) -> dict:
    live = [r for r in batch.rows if r is not None and not r.done]
    cache = batch.cache
    rows, columns = cache.capacity
    return {
        "live": len(live),
        "computed": sum(r.computed for r in live),
        "allocated": rows * columns,
        "spanned": cache.rows * cache.width,
        "paged": paged_tokens(live),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--name", default="kv_memory")
    args = ap.parse_args()
    judge = load_judge("smollm2-135m")
    inputs = bulk_inputs(args.data, args.samples, CONFIGS["cpu"]["source_chars"])
    engine = TransformersEngine(judge)
    steps: list[dict] = []
    step = Stepper.step

    def counted(self, batch):
        step(self, batch)
        steps.append(account(batch))

    Stepper.step = counted
    try:
        SummarizationScorer(engine=engine, **bulk_options()).score_many(inputs, on_error="return")
    finally:
        Stepper.step = step
    per_token = KVGeometry.of(judge.model.config, judge.model.dtype).bytes_per_token
    budget = engine.token_budget
    busiest = max(steps, key=lambda s: (s["live"], s["computed"]))
    lines = [
        f"# KV held at bulk: slots against a paged cache ({len(inputs)} samples, {len(steps)} decoding steps)",
        "",
        f"Judge {judge.name} ({per_token} bytes of keys and values a token). Command: `python -m research.kv_memory "
        f"--data DATA/summeval_dev.jsonl --samples {args.samples}`. Tokens held after each step, over the live rows; "
        f"the module docstring says how each is counted.",
        "",
        "| held | peak tokens | peak MiB | mean tokens | at the busiest step: tokens a live row "
        f"| rows a budget of {budget} tokens fits |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in (
        ("computed", "the rows' own tokens (shared prefixes counted in every row)"),
        ("allocated", "slots allocated (the buffers)"),
        ("spanned", "slots spanned (live span x widest row)"),
        ("paged", f"paged, {BLOCK}-token blocks, shared full blocks held once"),
    ):
        peak = max(s[key] for s in steps)
        mean = sum(s[key] for s in steps) / len(steps)
        per_row = busiest[key] / max(busiest["live"], 1)
        lines.append(
            f"| {label} | {peak} | {peak * per_token / 2**20:.0f} | {mean:.0f} | {per_row:.0f} | "
            f"{int(budget / per_row) if per_row else '-'} |"
        )
    lines += [
        "",
        f"The busiest step held {busiest['live']} live rows. Slots allocated are what the process holds whatever "
        "the rows; a budget's rows for them assume the buffers were sized to the rows (spanned is that bound).",
    ]
    publish(args.name, lines)


if __name__ == "__main__":
    main()
