"""Two versions of the engine on the ladder's standard workload, in turns: walls and every verdict.

    git worktree add /tmp/before <commit> && ln -s $PWD/models/converted /tmp/before/models/converted
    python -m research.engine_ab --data DATA/summeval_dev.jsonl --before /tmp/before --after . --turns ABBA
    python -m research.engine_ab --data DATA/summeval_dev.jsonl --before /tmp/before --bulk 40 --repeats 1

Each turn is a process of its own that imports the package from one tree, warms up, and runs rungs 7a, 7 and 8
(--repeats times each). Then the medians per rung and tree, and the verdicts and P(yes) of each rung compared
between the trees: flips, and the largest change of a probability; and the time outside the forward passes (picks,
the vocabulary projection at read points, admission, the step's update, the scorers, and the grammar masks where
they are filled after the pass rather than beside it), as a share of the passes' time, from the engine's timing
hook; and each turn's peak resident memory. --bulk N: the
ladder's bulk workload instead (its first N samples), rung 7 only. The machine's speed swings by a tenth or more
within minutes, so the turns alternate (ABBA) and only a difference beyond the runs' own spread means anything.
Writes results/engine_ab.md (--name).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNGS = ("7a", "7", "8")


def one_turn(tree: Path, data: Path, repeats: int, bulk: int = 0) -> dict:
    """Runs in a process of its own, started by its path with PYTHONPATH set to the tree: the tree's package and
    ladder are the ones imported (the child's sys.path holds this folder, then the tree)."""
    import offline_sumscore

    if not offline_sumscore.__file__.startswith(str(tree)):
        raise SystemExit(f"imported {offline_sumscore.__file__}, not the tree {tree}")
    try:
        from benchmarks.lib.ladder import ladder_rungs
        from benchmarks.lib.workloads import CONFIGS, bulk_inputs, frozen_inputs, ladder_caps
    except ImportError:  # a tree from before benchmarks/lib, when the ladder lived in benchmarks/throughput.py
        from benchmarks.throughput import CONFIGS, bulk_inputs, frozen_inputs, ladder_caps, ladder_rungs
    from offline_sumscore import SummarizationScorer, load_judge

    cfg = CONFIGS["cpu"]
    judge = load_judge("smollm2-135m")
    if bulk:
        inputs = bulk_inputs(data, bulk, cfg["source_chars"])
    else:
        inputs = frozen_inputs(data, cfg["samples"], cfg["source_chars"])
    caps = ladder_caps(cfg)
    ladder = ladder_rungs(judge, caps, cfg)  # the tree's own rungs: (label, engine factory, scorer options)
    rungs = {name: ladder[name][1:] for name in (("7",) if bulk else RUNGS)}
    for name in [n for n in ("7", "8") if n in rungs]:  # warm-up: grammars and kernels of both designs
        make, options = rungs[name]
        SummarizationScorer(engine=make(), **options).score_many(inputs[:1], on_error="return")
    out: dict = {}
    for _ in range(repeats):
        for name, (make, options) in rungs.items():
            timings: list = []
            engine = make(on_timing=timings.append)
            started = time.perf_counter()
            results = SummarizationScorer(engine=engine, **options).score_many(inputs, on_error="return")
            wall = time.perf_counter() - started
            passes = sum(t.seconds for t in timings if t.kind != "masks")
            rows = [r.to_dict() if hasattr(r, "to_dict") else {"error": str(r)} for r in results]
            verdicts = [
                [(v.get("supported"), v.get("p_supported")) for v in r.get("claims") or []]
                + [(v.get("answered"), v.get("p_answered")) for v in r.get("coverage_verdicts") or []]
                for r in rows
            ]
            record = out.setdefault(name, {"walls": [], "outside": [], "verdicts": verdicts})
            record["walls"].append(wall)
            # The masks are counted, not subtracted: filled beside a pass (a GPU's, or a CPU's as once tried) their
            # time lies inside the pass's, and subtracting it would count it twice.
            record["outside"].append((wall - passes) / passes)
    # The process's peak resident memory (Linux: KiB), the whole turn's: loading, warm-up and every run.
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return out


def outside(turns: list[dict], rung: str) -> str:
    """The range of a tree's time outside the passes, as a share of its passes' time."""
    shares = [share for turn in turns for share in turn[rung]["outside"]]
    return f"{min(shares):.1%} to {max(shares):.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the engine before (with models/)")
    ap.add_argument("--after", type=Path, default=HERE.parent)
    ap.add_argument("--turns", default="ABBA", help="A: before, B: after, in this order")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each rung in a turn")
    ap.add_argument("--bulk", type=int, default=0, help="the bulk workload's first N samples, rung 7 only")
    ap.add_argument("--name", default="engine_ab")
    ap.add_argument("--turn", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.turn:
        tree = Path(args.turn[0]).resolve()
        Path(args.turn[1]).write_text(json.dumps(one_turn(tree, args.data, args.repeats, args.bulk)))
        return
    # Imported once the turns are done with: a turn's process imports only from the tree it measures.
    from research.bulk_turns import compare

    runs: dict[str, list[dict]] = {"A": [], "B": []}
    peaks: dict[str, list[int]] = {"A": [], "B": []}  # each turn's peak resident memory, MiB
    with tempfile.TemporaryDirectory() as tmp:
        for k, turn in enumerate(args.turns):
            tree = (args.before if turn == "A" else args.after).resolve()
            out = Path(tmp) / f"{k}.json"
            cmd = [sys.executable, __file__, "--data", str(args.data), "--before", str(args.before)]
            cmd += ["--repeats", str(args.repeats), "--bulk", str(args.bulk)]
            env = dict(os.environ, PYTHONPATH=str(tree))
            subprocess.run(cmd + ["--turn", str(tree), str(out)], check=True, env=env)
            record = json.loads(out.read_text())
            peaks[turn].append(record.pop("peak_rss_mib"))
            runs[turn].append(record)
    lines = [
        f"# Engine A/B: {args.before} (A) against {args.after} (B)",
        "",
        f"Turns {args.turns}, {args.repeats} runs of each rung a turn; the ladder's "
        + (f"bulk workload, {args.bulk} samples" if args.bulk else "standard workload")
        + f" ({args.data.name}).",
        "",
        "| rung | A walls s | B walls s | A median | B median | A / B | verdicts | flips | largest P change "
        "| outside the passes, A | B |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rung in runs["A"][0]:
        a = [w for r in runs["A"] for w in r[rung]["walls"]]
        b = [w for r in runs["B"] for w in r[rung]["walls"]]
        total, flips, largest = compare(runs["A"][0][rung]["verdicts"], runs["B"][0][rung]["verdicts"])
        lines.append(
            f"| {rung} | {', '.join(f'{w:.2f}' for w in a)} | {', '.join(f'{w:.2f}' for w in b)} | "
            f"{statistics.median(a):.2f} | {statistics.median(b):.2f} | "
            f"{statistics.median(a) / statistics.median(b):.3f} | {total} | {flips} | {largest:.1e} | "
            f"{outside(runs['A'], rung)} | {outside(runs['B'], rung)} |"
        )
    a_peaks, b_peaks = (", ".join(map(str, peaks[t])) for t in "AB")
    lines += ["", f"Peak resident memory of each turn's process, MiB: A {a_peaks}; B {b_peaks}."]
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
