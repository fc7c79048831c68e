"""The decoding rows' attention kernel (engine/local/decode_kernel.cpp) against the SDPA call it replaces, in turns.

    python research/decode_kernel.py

One layer's call over the decoding rows of a pass, on slots laid out as KVSlots lays them ([slots, kv heads, 1,024
columns, dim], rows left-aligned), SmolLM2-135M's geometry (9 query heads, 3 kv heads, dim 64) and lengths drawn as
the bulk workload's. SDPA: the engine's call before the kernel, every slot up to the longest row with an additive
mask. Kernel: each row its own columns. Between calls a 800 MB buffer is written, so keys and values come from
memory as in the engine (its slots hold 100 MB a layer at bulk, past the 32 MB cache), not from the cache. The
bandwidth column: the bytes of keys and values the rows need over the kernel's time; the streaming reference is
torch reading the padded span once (a sum), about what this machine moves. Writes results/decode_kernel.md (--name).
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

from offline_sumscore.engine.local.decode_kernel import decode_kernel  # noqa: E402
from research.tables import publish  # noqa: E402

F = torch.nn.functional
HEADS, KV_HEADS, DIM, COLUMNS = 9, 3, 64, 1024
CASES = ((64, 150, 470), (64, 400, 470), (32, 300, 460), (16, 100, 900), (8, 400, 500), (1, 500, 500))


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


def case(kernel, keys, values, rows: int, low: int, high: int, flush, repeats: int) -> dict:
    group = HEADS // KV_HEADS
    lengths = torch.randint(low, high + 1, (rows,))
    stop = int(lengths.max())
    query = torch.randn(rows, KV_HEADS, group, DIM)
    allowed = torch.arange(stop)[None, :] < lengths[:, None]
    mask = torch.zeros(rows, 1, group, stop).masked_fill_(~allowed[:, None, None], float("-inf"))
    slots, starts = torch.arange(rows), torch.zeros(rows, dtype=torch.long)
    k, v = keys[:rows, :, :stop], values[:rows, :, :stop]

    def sdpa():
        return F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=DIM**-0.5)

    def ours():
        return kernel(query, keys, values, slots, starts, lengths, DIM**-0.5)

    def stream():  # the padded span read once by torch (a sum): what this machine streams
        return k.sum() + v.sum()

    diff = (sdpa() - ours()).abs().max().item()
    a, b, c = in_turns((sdpa, ours, stream), flush, repeats)
    needed = int(lengths.sum())
    moved = needed * KV_HEADS * DIM * 4 * 2  # keys and values, float32
    spanned = rows * stop * KV_HEADS * DIM * 4 * 2
    return dict(
        needed=needed, padded=rows * stop, sdpa=a, kernel=b, gbs=moved / b / 1e6, stream=spanned / c / 1e6, diff=diff
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="decode_kernel")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    kernel, how = decode_kernel(torch.device("cpu"), torch.float32, DIM)
    if kernel is None:
        raise SystemExit(f"the kernel does not run here: {how}")
    build_s = time.perf_counter() - started
    keys, values = torch.randn(64, KV_HEADS, COLUMNS, DIM), torch.randn(64, KV_HEADS, COLUMNS, DIM)
    scratch = torch.empty(200_000_000)
    lines = [
        f"# The decoding rows' attention kernel against SDPA (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()})",
        "",
        f"Command: `python research/decode_kernel.py`. Kernel ready in {build_s:.1f} s (a build, or torch's cache). "
        f"One layer's call, median ms of {args.repeats} calls in turns, the cache flushed before each. Cells: query "
        "token x key columns per kv head. Kernel GB/s: keys and values the rows need over the kernel's ms; stream "
        "GB/s: torch summing the padded span's keys and values.",
        "",
        "| rows | lengths | cells needed | cells SDPA computes | SDPA ms | kernel ms | SDPA / kernel | kernel GB/s "
        "| stream GB/s | largest difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rows, low, high in CASES:
        r = case(kernel, keys, values, rows, low, high, lambda: scratch.fill_(1.0), args.repeats)
        lines.append(
            f"| {rows} | {low}-{high} | {r['needed']} | {r['padded']} | {r['sdpa']:.2f} | {r['kernel']:.2f} | "
            f"{r['sdpa'] / r['kernel']:.2f} | {r['gbs']:.1f} | {r['stream']:.1f} | {r['diff']:.1e} |"
        )
        print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
