"""Would a compiled decoder pay on a CPU? The profile's bound replayed eager and under torch.compile, in turns.

    python research/compile_probe.py                      # the passes in benchmarks/results/profile_cpu.json
    python research/compile_probe.py --mode max-autotune-no-cudagraphs

The profile (benchmarks/profile_engine.py) logs every forward pass of the full engine on the ladder's standard
workload; its bound replays them through the bare decoder (a prompt step's tokens spread evenly over its rows, a
decoding step's tokens as one-token rows, no cache). Here the same replay runs through the decoder eager and through
torch.compile(decoder, dynamic=True) (inductor: the norms, rotary, activations and residual adds fused into C++
loops; the prepacked oneDNN linears stay calls), alternating, after one untimed compiling round whose time is
reported apart (it is paid once a process, or once a cache). Both are checked to give the same hidden states (to
1e-4). This measures what compiling could win around the matmuls, not our engine's path: its ragged attention is
Python and would break the graph at every layer. Prints a markdown table; writes results/compile_probe.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.profile_engine import bound_shapes, replay  # noqa: E402
from offline_sumscore import load_judge  # noqa: E402

PROFILE = HERE.parent / "benchmarks" / "results" / "profile_cpu.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--engine", default="rung 7 (the full engine)")
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="compile_probe")
    args = ap.parse_args()
    log = json.loads(args.profile.read_text())[args.engine]["passes"]["log"]
    shapes = bound_shapes(log)
    judge = load_judge()
    eager = judge.model.model
    device = judge.model.device
    compiled = torch.compile(eager, dynamic=True, mode=args.mode)
    with torch.inference_mode():
        probe = torch.randint(0, 1000, (3, 17), device=device)
        expected = eager(input_ids=probe, use_cache=False).last_hidden_state
        started = time.perf_counter()
        got = compiled(input_ids=probe, use_cache=False).last_hidden_state
        first_compile = time.perf_counter() - started
        largest = (got - expected).abs().max().item()
        replay(eager, shapes, device)  # warm
        started = time.perf_counter()
        replay(compiled, shapes, device)  # every new shape class compiles here
        warm_compiled = time.perf_counter() - started
        walls: dict[str, list[float]] = {"eager": [], "compiled": []}
        for k in range(args.rounds):
            order = ("eager", "compiled") if k % 2 == 0 else ("compiled", "eager")
            for name in order:
                walls[name].append(replay(eager if name == "eager" else compiled, shapes, device))
    e, c = statistics.median(walls["eager"]), statistics.median(walls["compiled"])
    lines = [
        f"# A compiled decoder on the CPU: the profile's {len(shapes)} passes replayed ({args.engine}, torch "
        f"{torch.__version__}, mode {args.mode}, {torch.get_num_threads()} threads)",
        "",
        "| decoder | median s | rounds s | x eager |",
        "|---|---|---|---|",
        f"| eager | {e:.2f} | {' / '.join(f'{w:.2f}' for w in walls['eager'])} | 1.00 |",
        f"| compiled | {c:.2f} | {' / '.join(f'{w:.2f}' for w in walls['compiled'])} | {e / c:.2f} |",
        "",
        f"Compiling: {first_compile:.1f} s for the first call, and the first replay through the compiled decoder took "
        f"{warm_compiled:.1f} s (new shapes recompile). Largest difference in hidden states: {largest:.1e}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / f"{args.name}.md").write_text(text)


if __name__ == "__main__":
    main()
