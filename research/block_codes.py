"""The embedded judge's projections as 4-bit block codes (the engine's block_codes.py) against oneDNN on prepacked
float32 weights (cpu_gemm.py), at the row counts of the engine's passes.

    python -m research.block_codes

The judge's 210 decoder projections are loaded from its converted weights, their block codes found as the engine
finds them (every weight rebuilt to the bit, or the script stops), and both ways timed over all 210 in alternating
calls at 1 to 256 rows. Outputs are compared with oneDNN's. Writes results/block_codes.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from research.tables import publish

HERE = Path(__file__).resolve().parent

ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)


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


def projections():
    """The embedded judge's projection weights, float32 [out, in], from its converted safetensors."""
    from safetensors.torch import load_file

    from offline_sumscore.engine.judge import resolve_model_path

    path = Path(resolve_model_path(None))
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        weights.update(load_file(file))
    return [w.float() for name, w in sorted(weights.items()) if name.endswith("proj.weight")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="block_codes")
    args = ap.parse_args()
    from offline_sumscore.engine.cpu import block_codes
    from offline_sumscore.engine.cpu.cpu_gemm import ROWS_HINT

    kernel, why = block_codes.kernel()
    if kernel is None:
        raise SystemExit(f"the block-code kernel is {why}")
    dense = projections()
    started = time.perf_counter()
    coded = [block_codes.find_block_codes(w) for w in dense]
    found_s = time.perf_counter() - started
    if any(c is None for c in coded):
        raise SystemExit(f"{sum(c is None for c in coded)} of {len(dense)} projections are not block codes")
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT) for w in dense]
    float_mb = sum(w.numel() for w in dense) * 4 / 1e6
    coded_mb = sum(c.nbytes for c in coded) / 1e6

    def onednn(x):
        return [
            torch.ops.mkldnn._linear_pointwise(x[w.shape[1]], p, None, "none", [], "") for w, p in zip(dense, packed)
        ]

    def codes(x):
        return [block_codes.linear(kernel, x[w.shape[1]], c, None) for w, c in zip(dense, coded)]

    lines = [
        f"# The embedded judge's projections as block codes against oneDNN (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        f"Command: `python -m research.block_codes`. {len(dense)} projections: {float_mb:.0f} MB in float32, "
        f"{coded_mb:.0f} MB as codes (found and checked in {found_s:.1f} s). Median ms of alternating calls over all "
        "of them; largest difference: the outputs against oneDNN's.",
        "",
        "| rows | oneDNN prepacked ms | block codes ms | oneDNN / codes | largest difference |",
        "|---|---|---|---|---|",
    ]
    torch.manual_seed(0)
    with torch.inference_mode():
        for rows in ROWS:
            x = {k: torch.randn(rows, k) for k in {w.shape[1] for w in dense}}
            diff = max((a - b).abs().max().item() for a, b in zip(onednn(x), codes(x)))
            a, b = in_turns(lambda x=x: onednn(x), lambda x=x: codes(x), 7)
            lines.append(f"| {rows} | {a:.1f} | {b:.1f} | {a / b:.2f} | {diff:.1e} |")
            print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
