"""The passes' attention kernel (engine/cpu/attention_kernel.cpp) against the SDPA calls it replaces, in turns.

    python -m research.attention_kernel

One layer's attention for a pass laid out as KVSlots lays it ([slots, kv heads, 2,048 columns, dim], rows
left-aligned), SmolLM2-135M's geometry (9 query heads, 3 kv heads, dim 64). The layouts: decoding rows (one token
each, lengths drawn as the bulk workload's), fresh prompts, prompts after a stored prefix, rows checking drafts,
and a mixed pass as the standard workload runs one. SDPA: the engine's calls without the kernel (ragged_attention
with layout.kernel None: one call over the decoding rows' span, masked, and one call per run of prompts or drafts,
padded to a grid). Kernel: every token its own columns, one call. Between calls a 800 MB buffer is written, so keys and
values come from memory as in the engine, not from the cache. GFLOP/s: the cells the tokens need (query x key per kv
head) x query heads x 4 x dim over the kernel's time. Writes results/attention_kernel.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from offline_sumscore.engine.cpu.attention_kernel import attention_kernel
from offline_sumscore.engine.local.attention import RaggedPass, ragged_attention
from research.tables import publish

HERE = Path(__file__).resolve().parent

HEADS, KV_HEADS, DIM, COLUMNS = 9, 3, 64, 2048


def layouts(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, columns before each slot's feed, its tokens) for each pass measured."""
    mixed = (  # a pass of the standard workload (rung 7): decoding rows, two prompts after their source, drafts
        [405, 348, 280, 328, 328, 326, 331, 305, 288, 179, 178, 280, 329, 268, 268, 190, 113, 113, 176],
        [1, 4, 63, 1, 1, 1, 1, 1, 1, 1, 1, 73, 4, 58, 61, 4, 77, 77, 4],
    )
    return [
        ("64 decoding rows, 150-470 columns", rng.integers(149, 470, 64), np.ones(64, int)),
        ("16 decoding rows, 100-900 columns", rng.integers(99, 900, 16), np.ones(16, int)),
        ("6 fresh prompts of 300-380 tokens", np.zeros(6, int), np.array([378, 363, 351, 347, 307, 299])),
        ("1 fresh prompt of 1,024 tokens", np.zeros(1, int), np.array([1024])),
        ("8 prompts of 150 after 300 stored", np.full(8, 300), np.full(8, 150)),
        ("4 prompts of 64 after 1,500 stored", np.full(4, 1500), np.full(4, 64)),
        ("19 rows checking 8-token drafts at 300", np.full(19, 300), np.full(19, 9)),
        ("a standard workload pass (19 rows)", np.array(mixed[0]), np.array(mixed[1])),
    ]


def in_turns(fns, flush, repeats: int) -> list[float]:
    """Median ms of each function, called in turns, the cache flushed before every call."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            flush()
            started = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - started) * 1e3)
    return [statistics.median(t) for t in times]


def case(kernel, keys, values, filled, counts, flush, repeats: int) -> dict:
    sdpa_layout = RaggedPass(filled, counts, torch.device("cpu"))
    kernel_layout = RaggedPass(filled, counts, torch.device("cpu"))
    kernel_layout.kernel = kernel
    query = torch.randn(1, HEADS, sdpa_layout.tokens, DIM)
    slots = len(counts)

    def sdpa():
        return ragged_attention(query, keys[:slots], values[:slots], sdpa_layout, DIM**-0.5)

    def ours():
        return ragged_attention(query, keys[:slots], values[:slots], kernel_layout, DIM**-0.5)

    diff = (sdpa() - ours()).abs().max().item()
    a, b = in_turns((sdpa, ours), flush, repeats)
    computed, needed = sdpa_layout.cells
    return dict(
        tokens=sdpa_layout.tokens,
        needed=needed,
        computed=computed,
        sdpa=a,
        kernel=b,
        diff=diff,
        gflops=needed * HEADS * 4 * DIM / b / 1e6,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="attention_kernel")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    kernel, how = attention_kernel(torch.device("cpu"), torch.float32, DIM)
    if kernel is None:
        raise SystemExit(f"the kernel does not run here: {how}")
    build_s = time.perf_counter() - started
    keys, values = torch.randn(64, KV_HEADS, COLUMNS, DIM), torch.randn(64, KV_HEADS, COLUMNS, DIM)
    scratch = torch.empty(200_000_000)
    lines = [
        f"# The passes' attention kernel against SDPA (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})",
        "",
        f"Command: `python -m research.attention_kernel`. Kernel ready in {build_s:.1f} s (a build, or torch's cache). "
        f"One layer's attention for the pass, median ms of {args.repeats} calls in turns, the cache flushed before "
        "each. Cells: query token x key columns per kv head; SDPA's include its padding. Kernel GFLOP/s: the needed "
        "cells' multiply-adds (scores and values, 9 query heads, dim 64) over the kernel's ms.",
        "",
        "| pass | tokens | cells needed | cells SDPA computes | SDPA ms | kernel ms | SDPA / kernel | kernel GFLOP/s "
        "| largest difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, filled, counts in layouts(np.random.default_rng(0)):
        r = case(kernel, keys, values, filled, counts, lambda: scratch.fill_(1.0), args.repeats)
        lines.append(
            f"| {name} | {r['tokens']} | {r['needed']} | {r['computed']} | {r['sdpa']:.2f} | {r['kernel']:.2f} | "
            f"{r['sdpa'] / r['kernel']:.2f} | {r['gflops']:.0f} | {r['diff']:.1e} |"
        )
        print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
