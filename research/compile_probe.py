"""Would a compiled decoder pay on a CPU? The profile's bound replayed eager and under torch.compile, in turns.

    OFFLINE_SUMSCORE_CPU_GEMM=torch python research/compile_probe.py --name compile_probe_torch_linear
    OFFLINE_SUMSCORE_CPU_GEMM=torch python research/compile_probe.py --freezing --against-packed \
        --name compile_probe_freezing

The profile (benchmarks/profile_engine.py) logs every forward pass of the full engine on the ladder's standard
workload; its bound replays them through the bare decoder (a prompt step's tokens spread evenly over its rows, a
decoding step's tokens as one-token rows, no cache). Here the same replay runs through the decoder eager and through
torch.compile(decoder, dynamic=True) (inductor: the norms, rotary, activations and residual adds fused into C++
loops), alternating, after one untimed compiling round whose time is reported apart (it is paid once a process, or
once a cache), with the largest difference in hidden states between them. inductor cannot lower our prepacked oneDNN
linears, so the judge runs on torch's (OFFLINE_SUMSCORE_CPU_GEMM=torch). This measures what compiling could win
around the matmuls, not our engine's path: its ragged attention is Python and would break the graph at every layer.

--freezing sets inductor's freezing (parameters as constants: inductor prepacks the linears' weights for oneDNN
itself, as engine/cpu/cpu_gemm.py does by hand, and can fuse around them). --against-packed replays a second copy of the
judge on our prepacked linears (eager, what the engine runs) in the same turns. --eager-attention keeps the attention
calls out of the graph (torch.compiler.disable: a graph break in every layer, as the engine's ragged attention would
be), to see what compiling wins around them. Prints a markdown table; writes results/compile_probe.md (--name).
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
from research.tables import publish  # noqa: E402

PROFILE = HERE.parent / "benchmarks" / "results" / "profile_cpu.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--engine", default="rung 7 (the full engine)")
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--freezing", action="store_true", help="inductor's freezing: weights as constants, prepacked")
    ap.add_argument("--against-packed", action="store_true", help="also replay the judge on our prepacked linears")
    ap.add_argument("--eager-attention", action="store_true", help="attention calls left out of the graph")
    ap.add_argument("--name", default="compile_probe")
    args = ap.parse_args()
    if args.freezing:
        import torch._inductor.config as inductor_config  # a bare `import torch...` here would shadow torch

        inductor_config.freezing = True
    log = json.loads(args.profile.read_text())[args.engine]["passes"]["log"]
    shapes = bound_shapes(log)
    judge = load_judge("smollm2-135m")
    eager = judge.model.model
    decoders = {"eager": eager}
    if args.against_packed:
        import os

        os.environ["OFFLINE_SUMSCORE_CPU_GEMM"] = "onednn"
        decoders["eager, our prepacked linears"] = load_judge("smollm2-135m").model.model
    device = judge.model.device
    if args.eager_attention:
        from transformers import AttentionInterface

        from offline_sumscore.engine.local import attention

        attention.register_attention()  # its boolean masks
        AttentionInterface.register(attention.ATTENTION, torch.compiler.disable(attention.grouped_query_sdpa))
        for decoder in decoders.values():  # every decoder on our attention function (a plain load runs SDPA's)
            decoder.set_attn_implementation(attention.ATTENTION)
        # With freezing, each layer's weights are constants of its own graph: a graph break in every layer means a
        # graph per layer and side of the break (dynamo's default limit, 8 graphs a function, leaves the rest eager).
        torch._dynamo.config.recompile_limit = 256
    compiled = torch.compile(eager, dynamic=True, mode=args.mode)
    with torch.inference_mode():
        probe = torch.randint(0, 1000, (3, 17), device=device)
        expected = eager(input_ids=probe, use_cache=False).last_hidden_state
        started = time.perf_counter()
        got = compiled(input_ids=probe, use_cache=False).last_hidden_state
        first_compile = time.perf_counter() - started
        largest = (got - expected).abs().max().item()
        started = time.perf_counter()
        replay(compiled, shapes, device)  # every new shape class compiles here
        warm_compiled = time.perf_counter() - started
        decoders["compiled"] = compiled
        for decoder in decoders.values():
            replay(decoder, shapes, device)  # warm (the compiled one: every shape class compiled above)
        walls: dict[str, list[float]] = {name: [] for name in decoders}
        for k in range(args.rounds):
            for name in list(decoders) if k % 2 == 0 else list(decoders)[::-1]:
                walls[name].append(replay(decoders[name], shapes, device))
    e = statistics.median(walls["eager"])
    settings = f"mode {args.mode}" + (", freezing" if args.freezing else "")
    settings += ", attention eager" if args.eager_attention else ""
    lines = [
        f"# A compiled decoder on the CPU: the profile's {len(shapes)} passes replayed ({args.engine}, torch "
        f"{torch.__version__}, {settings}, {torch.get_num_threads()} threads)",
        "",
        "| decoder | median s | rounds s | x eager |",
        "|---|---|---|---|",
    ]
    for name, runs in walls.items():
        m = statistics.median(runs)
        lines.append(f"| {name} | {m:.2f} | {' / '.join(f'{w:.2f}' for w in runs)} | {e / m:.2f} |")
    lines += [
        "",
        f"Compiling: {first_compile:.1f} s for the first call, and the first replay through the compiled decoder took "
        f"{warm_compiled:.1f} s (new shapes recompile). Largest difference in hidden states: {largest:.1e}.",
    ]
    publish(args.name, lines)


if __name__ == "__main__":
    main()
