"""The embedded judge's gated MLP on prepacked weights as the engine runs it (three oneDNN calls, then SiLU and the
gate's product as two elementwise passes) against oneDNN's post-ops (SiLU applied by the gate's projection as it
writes, the product by the up projection's: two passes over the widest activations saved), at the token counts
of the engine's passes. The calls alternate (in_turns), and both outputs are compared. Then the whole
embedded judge's decoder on a plain [1, tokens] pass, its MLPs switched between the two in turns within one process
(so the machine's drift falls on both), at a mix of token counts like the bulk workload's passes.

    python research/fused_mlp.py

Writes results/fused_mlp.md (--name).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from research.attention_kernels import HIDDEN, INTERMEDIATE, in_turns  # noqa: E402
from research.tables import publish  # noqa: E402

TOKENS = (1, 20, 60, 300, 700, 2000)  # decoding passes at the low end, the bulk workload's prompt passes at 700
PASSES = [730] * 10 + [55] * 6 + [300] * 4 + [1400] * 2  # token counts of the decoder passes, each run 3 times


def mlp_pair(tokens: int) -> tuple[float, float, float]:
    """(separate ms, fused ms, largest difference) for one MLP call of `tokens` tokens."""
    linear = torch.ops.mkldnn._linear_pointwise
    weights = (torch.randn(INTERMEDIATE, HIDDEN) / 24, torch.randn(INTERMEDIATE, HIDDEN) / 24)
    gate, up = (torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights)
    down = torch.ops.mkldnn._reorder_linear_weight(torch.randn(HIDDEN, INTERMEDIATE) / 40, 64)
    x = torch.randn(1, tokens, HIDDEN)

    def separate():
        g, u = linear(x, gate, None, "none", [], ""), linear(x, up, None, "none", [], "")
        return linear(torch.nn.functional.silu(g) * u, down, None, "none", [], "")

    def fused():
        activated = linear(x, gate, None, "swish", [], "")
        return linear(linear.binary(x, activated, up, None, "mul"), down, None, "none", [], "")

    diff = (separate() - fused()).abs().max().item()
    return *in_turns(separate, fused, repeats=15), diff


def decoder_turns(rounds: int = 3) -> dict[int, tuple[float, float]]:
    """Seconds of the embedded judge's decoder per token count: (separate, fused), summed over the rounds."""
    from offline_sumscore import load_judge

    model = load_judge("smollm2-135m").model  # its linears prepacked (engine/cpu/cpu_gemm.py)
    mlps = [layer.mlp for layer in model.model.layers]
    separate = [m.forward for m in mlps]  # as loaded: each projection packed, SiLU and the product elementwise
    fused = [_fused(m) for m in mlps]
    totals: dict[int, list[float]] = {}
    with torch.inference_mode():
        for rnd in range(rounds):
            for tokens in PASSES:
                ids = torch.randint(0, model.config.vocab_size, (1, tokens))
                order = ((0, separate), (1, fused)) if rnd % 2 == 0 else ((1, fused), (0, separate))
                for k, forwards in order:
                    for m, forward in zip(mlps, forwards):
                        m.forward = forward
                    started = time.perf_counter()
                    model.model(input_ids=ids)
                    totals.setdefault(tokens, [0.0, 0.0])[k] += time.perf_counter() - started
    return {t: (a, b) for t, (a, b) in sorted(totals.items())}


def _fused(mlp):
    """The MLP on oneDNN post-ops: its weights packed again, SiLU and the product applied as the projections write."""
    linear = torch.ops.mkldnn._linear_pointwise
    projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)  # no biases in these families
    gate, up, down = (torch.ops.mkldnn._reorder_linear_weight(p.weight.detach(), 64) for p in projections)

    def forward(x):
        activated = linear(x, gate, None, "swish", [], "")
        return linear(linear.binary(x, activated, up, None, "mul"), down, None, "none", [], "")

    return forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="fused_mlp")
    args = ap.parse_args()
    torch.manual_seed(0)
    lines = [
        f"# The gated MLP: separate elementwise passes against oneDNN post-ops (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        f"Command: `python research/fused_mlp.py`. {HIDDEN} -> {INTERMEDIATE} -> {HIDDEN} (SmolLM2-135M), median "
        "ms of 15 alternating calls.",
        "",
        "| tokens | separate ms | fused ms | separate / fused | largest difference |",
        "|---|---|---|---|---|",
    ]
    for tokens in TOKENS:
        a, b, diff = mlp_pair(tokens)
        lines.append(f"| {tokens} | {a:.3f} | {b:.3f} | {a / b:.2f} | {diff:.1e} |")
    lines += [
        "",
        "## The embedded judge's decoder, its MLPs switched in turns",
        "",
        "| tokens a pass | passes | separate s | fused s | separate / fused |",
        "|---|---|---|---|---|",
    ]
    turns = decoder_turns()
    for tokens, (a, b) in turns.items():
        lines.append(f"| {tokens} | {PASSES.count(tokens) * 3} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    a, b = sum(t[0] for t in turns.values()), sum(t[1] for t in turns.values())
    lines.append(f"| all | {len(PASSES) * 3} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    publish(args.name, lines)


if __name__ == "__main__":
    main()
