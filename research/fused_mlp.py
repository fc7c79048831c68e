"""The embedded judge's gated MLP on prepacked weights, as the engine ran it (three oneDNN calls, then SiLU and the
gate's product as two elementwise passes) against the post-op fusion it runs now (engine/cpu_gemm.py,
fuse_gated_mlps: SiLU applied by the gate's projection as it writes, the product by the up projection's), at the
token counts of the engine's passes. The calls alternate (in_turns), and both outputs are compared.

    python research/fused_mlp.py

Writes results/fused_mlp.md (--name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from research.attention_kernels import HIDDEN, INTERMEDIATE, in_turns  # noqa: E402
from research.tables import publish  # noqa: E402

TOKENS = (1, 20, 60, 300, 700, 2000)  # decoding passes at the low end, the bulk workload's prompt passes at 700


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
    publish(args.name, lines)


if __name__ == "__main__":
    main()
