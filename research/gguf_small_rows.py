"""Where a GGUF judge's coded linear should stop multiplying the codes row by row (engine/cpu/gguf_codes.py's
row kernel) and rebuild the weight for torch's matmul instead, for each dtype that larger pass computes in.

    python -m research.gguf_small_rows [--gguf models/converted/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf]

One decoder layer's coded projections of the prepared GGUF (its q, k, v, o, gate, up and down weights as the file
holds them: Q4_K and Q6_K for the 1.5B), both ways, in alternating calls at 1 to 192 rows, in bfloat16 and in
float32, and, where the CPU has AVX512_BF16, the bfloat16 row kernel (each row's weights rounded to bfloat16,
vdpbf16ps) against the rebuilt bfloat16 weight. Writes results/gguf_small_rows.md (--name): the crossovers behind
gguf_codes.SMALL_ROWS and BF16_ROWS.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from research.block_codes import in_turns
from research.tables import publish

HERE = Path(__file__).resolve().parent
ROWS = (1, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192)
DEFAULT_GGUF = HERE.parent / "models" / "converted" / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"


def layer_weights(gguf: Path):
    """The coded projections of decoder layer 0: [(name, CodedTensor, codes)], read from the prepared folder."""
    from offline_sumscore.engine.cpu import gguf_codes
    from offline_sumscore.engine.gguf_weights import CODED, prepared_dir

    folder = prepared_dir(gguf, gguf.parent)
    if not (folder / CODED).exists():
        raise SystemExit(f"{gguf} is not prepared under {folder}: score one row with it first (sumscore --model)")
    mapping = gguf_codes.map_file(gguf)
    found = []
    for entry in json.loads((folder / CODED).read_text()):
        if ".layers.0." in entry["name"] and entry["name"].endswith("proj.weight"):
            coded = gguf_codes.CodedTensor(**{**entry, "permutation": None})
            found.append((entry["name"].split(".layers.0.")[1], coded, coded.codes(mapping)))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--name", default="gguf_small_rows")
    args = ap.parse_args()
    from offline_sumscore.engine.cpu import gguf_codes
    from offline_sumscore.engine.cpu.bf16_linears import fast_bf16_matmul

    module, why = gguf_codes.kernel()
    if module is None:
        raise SystemExit(f"the GGUF block-code kernel is not built: {why}")
    weights = layer_weights(args.gguf.resolve())
    scratch = gguf_codes.Scratch(gguf_codes.SCRATCH_ELEMENTS)
    _, evidence = fast_bf16_matmul()
    types = ", ".join(f"{name} {gguf_codes.CODED_TYPES[c.type][0]} {c.rows}x{c.columns}" for name, c, _ in weights)
    lines = [
        f"# A GGUF judge's coded linears: the row kernel against a rebuilt weight (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        f"Command: `python -m research.gguf_small_rows --gguf {args.gguf.name}`. Layer 0 of {args.gguf.name}: "
        f"{types}. bfloat16 on this CPU: {evidence}. Median ms of alternating calls over the layer's seven "
        "projections; 'rebuilt' is what a larger pass does (each weight rebuilt into the scratch buffer, then torch's "
        "linear in that dtype). Ratio above 1: the rebuilt weight is faster.",
        "",
        "| rows | row kernel ms | rebuilt, bfloat16 ms | codes / rebuilt bf16 | rebuilt, float32 ms "
        "| codes / rebuilt f32 | bf16 row kernel ms | bf16 codes / rebuilt bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    torch.manual_seed(0)
    with torch.inference_mode():
        layers = {
            dtype: [gguf_codes.CodedLinear(module, c, codes, None, scratch, dtype) for _, c, codes in weights]
            for dtype in (torch.bfloat16, torch.float32)
        }
        for rows in ROWS:
            x = {c.columns: torch.randn(rows, c.columns) for _, c, _ in weights}

            def codes(x=x):
                return [
                    module.gguf_codes_linear(x[c.columns], layer.codes, c.type)
                    for (_, c, _), layer in zip(weights, layers[torch.float32])
                ]

            def rebuilt(dtype, x=x):
                return [layer.large(x[c.columns].to(dtype)) for (_, c, _), layer in zip(weights, layers[dtype])]

            def bf16_codes(x=x):
                return [
                    module.gguf_codes_linear_bf16(x[c.columns].bfloat16(), c_codes, c.type) for _, c, c_codes in weights
                ]

            a, b = in_turns(codes, lambda: rebuilt(torch.bfloat16), 7)
            _, f = in_turns(codes, lambda: rebuilt(torch.float32), 7)
            bf16 = "-"
            if module.gguf_bf16_dots():
                r, b2 = in_turns(bf16_codes, lambda: rebuilt(torch.bfloat16), 7)
                bf16 = f"{r:.2f} | {r / b2:.2f}"
            lines.append(f"| {rows} | {a:.2f} | {b:.2f} | {a / b:.2f} | {f:.2f} | {a / f:.2f} | {bf16} |")
            print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
