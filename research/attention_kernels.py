"""Three kernel-level candidates for the CPU engine, timed alone at the embedded judge's shapes before any is built.

    python research/attention_kernels.py

1. Fresh prompts side by side (a run's first sources, nothing stored before them): SDPA over the padded grid with
   our additive causal mask, against SDPA's own causal flag (enable_gqa), which skips the keys after each query and
   so computes about half the cells.
2. The projections of a layer on oneDNN prepacked weights (engine/cpu/cpu_gemm.py): q, k and v as three linears against
   one fused linear, gate and up likewise, at the token counts of the engine's passes.
3. Decoding rows that share a prefix (a unit's rows: one source's questions, one summary's claims, the prefix
   copied into each row's slot): one call over every row's own columns (what the engine runs) against a cascade,
   the shared prefix attended once with the group's queries stacked and the rest per row, merged by log-sum-exp
   (torch's CPU flash kernel returns it). Checked to give the same output.

Each candidate runs in turns with what it would replace (ABAB..., median), so the machine's drift falls on both.
Prints a markdown table; writes results/attention_kernels.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from research.tables import publish  # noqa: E402

F = torch.nn.functional
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, DIM = 576, 1536, 9, 3, 64  # SmolLM2-135M's geometry


def in_turns(a, b, repeats: int = 7) -> tuple[float, float]:
    """Median ms of a and b, run alternately after one warm-up call each."""
    a(), b()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for k, fn in enumerate((a, b)):
            started = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def fresh_prompts(slots: int, width: int) -> tuple[float, float, float]:
    group = HEADS // KV_HEADS
    q = torch.randn(slots, HEADS, width, DIM)
    k, v = torch.randn(slots, KV_HEADS, width, DIM), torch.randn(slots, KV_HEADS, width, DIM)
    allowed = torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(width, width).masked_fill_(~allowed, float("-inf")).repeat(group, 1)[None, None]
    stacked = q.reshape(slots, KV_HEADS, group * width, DIM)

    def masked():
        return F.scaled_dot_product_attention(stacked, k, v, attn_mask=mask)

    def causal():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    diff = (masked().reshape(slots, HEADS, width, DIM) - causal()).abs().max().item()
    return *in_turns(masked, causal), diff


def projections(tokens: int) -> list[tuple[str, float, float]]:
    pack = lambda w: torch.ops.mkldnn._reorder_linear_weight(w, 64)  # noqa: E731
    linear = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # noqa: E731
    wq, wk, wv = (torch.randn(n, HIDDEN) * 0.03 for n in (HIDDEN, KV_HEADS * DIM, KV_HEADS * DIM))
    wg, wu = torch.randn(INTERMEDIATE, HIDDEN) * 0.03, torch.randn(INTERMEDIATE, HIDDEN) * 0.03
    q, k, v, g, u = (pack(w) for w in (wq, wk, wv, wg, wu))
    qkv, gate_up = pack(torch.cat([wq, wk, wv])), pack(torch.cat([wg, wu]))
    x = torch.randn(1, tokens, HIDDEN)
    rows = []
    a, b = in_turns(lambda: (linear(x, q), linear(x, k), linear(x, v)), lambda: linear(x, qkv))
    rows.append(("q, k, v", a, b))
    a, b = in_turns(lambda: (linear(x, g), linear(x, u)), lambda: linear(x, gate_up))
    rows.append(("gate, up", a, b))
    return rows


def cascade(groups: int, members: int, prefix: int, suffix: int) -> tuple[float, float, float]:
    """Decoding rows, `members` per group sharing `prefix` columns, each with `suffix` columns of its own."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    rows, group, stop = groups * members, HEADS // KV_HEADS, prefix + suffix
    keys, values = torch.randn(rows, KV_HEADS, stop, DIM), torch.randn(rows, KV_HEADS, stop, DIM)
    for g in range(groups):  # the prefix copied into every member's slot, as fork() does
        keys[g * members : (g + 1) * members, :, :prefix] = keys[g * members, :, :prefix]
        values[g * members : (g + 1) * members, :, :prefix] = values[g * members, :, :prefix]
    query = torch.randn(rows, KV_HEADS, group, DIM)  # one token a row, a kv group's heads stacked
    leads = torch.arange(groups) * members

    def plain():
        return F.scaled_dot_product_attention(query, keys, values)

    def merged():
        stacked = (
            query.reshape(groups, members, KV_HEADS, group, DIM)
            .transpose(1, 2)
            .reshape(groups, KV_HEADS, members * group, DIM)
        )
        shared, shared_lse = flash(stacked, keys[leads, :, :prefix], values[leads, :, :prefix])[:2]
        own, own_lse = flash(query, keys[:, :, prefix:], values[:, :, prefix:])[:2]
        shared = shared.reshape(groups, KV_HEADS, members, group, DIM).transpose(1, 2)
        shared = shared.reshape(rows, KV_HEADS, group, DIM)
        shared_lse = shared_lse.reshape(groups, KV_HEADS, members, group).transpose(1, 2)
        shared_lse = shared_lse.reshape(rows, KV_HEADS, group)
        top = torch.maximum(shared_lse, own_lse)
        a, b = torch.exp(shared_lse - top)[..., None], torch.exp(own_lse - top)[..., None]
        return (shared * a + own * b) / (a + b)

    diff = (plain() - merged()).abs().max().item()
    return *in_turns(plain, merged), diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="attention_kernels")
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = [
        f"# Kernel candidates for the CPU engine (torch {torch.__version__}, {torch.get_num_threads()} threads)",
        "",
        "Command: `python research/attention_kernels.py`. Median ms of 7 alternating calls per layer.",
        "",
        "## 1. Fresh prompts side by side: our additive causal mask against SDPA's causal flag",
        "",
        "| prompts x tokens | masked ms | is_causal ms | masked / causal | largest difference |",
        "|---|---|---|---|---|",
    ]
    for slots, width in ((8, 400), (3, 300), (1, 400)):
        a, b, diff = fresh_prompts(slots, width)
        lines.append(f"| {slots} x {width} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.1e} |")
    lines += [
        "",
        "## 2. Projections on prepacked weights: separate against fused",
        "",
        "| tokens | projections | separate ms | fused ms | separate / fused |",
        "|---|---|---|---|---|",
    ]
    for tokens in (20, 60, 300, 520):
        for name, a, b in projections(tokens):
            lines.append(f"| {tokens} | {name} | {a:.3f} | {b:.3f} | {a / b:.2f} |")
    lines += [
        "",
        "## 3. Decoding rows sharing a prefix: one call over each row's columns against a cascade",
        "",
        "| groups x rows | prefix + own columns | one call ms | cascade ms | one / cascade | largest difference |",
        "|---|---|---|---|---|---|",
    ]
    for groups, members, prefix, suffix in ((8, 8, 400, 50), (16, 4, 350, 100), (32, 2, 300, 150)):
        a, b, diff = cascade(groups, members, prefix, suffix)
        lines.append(f"| {groups} x {members} | {prefix} + {suffix} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.1e} |")
    publish(args.name, lines)


if __name__ == "__main__":
    main()
