"""The decoder's one-pass layer kernels (engine/cpu/layer_ops.cpp) against torch's operators, in turns.

    python -m research.layer_ops

The embedded judge's bare decoder (its prepacked linears, transformers' SDPA attention, no cache) on one row of T
tokens, with the kernels in place (as load_judge leaves it) and with torch's operators put back, alternating; then
each operator alone at a pass of 600 tokens. The machine's speed swings by a tenth within minutes, so the turns
alternate and the table gives every turn's median. Writes results/layer_ops.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from offline_sumscore import load_judge
from offline_sumscore.engine.cpu import layer_ops
from research.tables import publish

HERE = Path(__file__).resolve().parent


def timed(fn, n: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--name", default="layer_ops")
    args = parser.parse_args()
    judge = load_judge("smollm2-135m")
    decoder = judge.model.model
    lines = [
        "# The decoder's one-pass layer kernels against torch's operators",
        "",
        f"`python -m research.layer_ops`; judge {judge.name}; torch threads {torch.get_num_threads()}; "
        f"{judge.decisions.get('layer_ops')}. The bare decoder on one row of T tokens, kernels on and off in "
        f"alternating turns ({args.turns} each), medians; the outputs compared on the same input.",
        "",
        "| tokens | torch's operators ms | kernels ms | x | largest difference of the last hidden states |",
        "|---|---|---|---|---|",
    ]
    with torch.inference_mode():
        for tokens in (64, 256, 600, 1024):
            ids = torch.randint(0, 40000, (1, tokens), generator=torch.Generator().manual_seed(tokens))
            outs, walls = {}, {True: [], False: []}
            for on in (False, True):
                with kernels(judge.model, on):
                    outs[on] = decoder(input_ids=ids, use_cache=False).last_hidden_state
            n = max(1, 1200 // tokens)
            for turn in range(args.turns):
                for on in (False, True) if turn % 2 == 0 else (True, False):
                    with kernels(judge.model, on):
                        walls[on].append(timed(lambda ids=ids: decoder(input_ids=ids, use_cache=False), n))
            off, fused = statistics.median(walls[False]), statistics.median(walls[True])
            diff = (outs[True] - outs[False]).abs().max().item()
            lines.append(f"| {tokens} | {off * 1e3:.1f} | {fused * 1e3:.1f} | {off / fused:.3f} | {diff:.1e} |")
        lines += ["", *operator_table(judge, args.turns)]
    publish(args.name, lines)


def operator_table(judge, turns: int) -> list[str]:
    """One layer's norm, MLP and rotary embedding alone at 600 tokens, each way, in turns."""
    layer = judge.model.model.layers[0]
    config = judge.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    x = torch.randn(1, 600, config.hidden_size)
    q = torch.randn(1, 600, config.num_attention_heads, head_dim).transpose(1, 2)
    k = torch.randn(1, 600, config.num_key_value_heads, head_dim).transpose(1, 2)
    cos, sin = torch.randn(1, 600, head_dim), torch.randn(1, 600, head_dim)
    home = sys.modules[type(layer).__module__]
    cases = {
        "RMSNorm": lambda: layer.input_layernorm(x),
        "MLP (its three projections included)": lambda: layer.mlp(x),
        "rotary embedding (queries and keys)": lambda: home.apply_rotary_pos_emb(q, k, cos, sin),
    }
    lines = [
        "One layer's operator alone at 600 tokens (medians of the turns):",
        "",
        "| operator | torch's operators us | kernels us | x |",
        "|---|---|---|---|",
    ]
    for name, fn in cases.items():
        walls = {True: [], False: []}
        for turn in range(turns):
            for on in (False, True) if turn % 2 == 0 else (True, False):
                with kernels(judge.model, on):
                    walls[on].append(timed(fn, 50))
        off, fused = statistics.median(walls[False]), statistics.median(walls[True])
        lines.append(f"| {name} | {off * 1e6:.0f} | {fused * 1e6:.0f} | {off / fused:.2f} |")
    return lines


def kernels(model, on: bool):
    """The judge as load_judge left it (the kernels), or with torch's operators put back."""
    return nullcontext() if on else layer_ops.torch_operators(model)


if __name__ == "__main__":
    main()
