"""One Ray actor against two on this machine: the same rows through `sumscore score --engine ray`, end to end.

    python -m benchmarks.ray_scaling                 # embedded judge, 12 rows, chunks of 2, CPU
    python -m benchmarks.ray_scaling --gpus-per-judge 1 --judges 1,2,4,8 --model DIR   # one actor per GPU

The machine's CPUs are split between the actors (cpus_per_judge = CPUs / actors), so one actor may use every core.
Each configuration runs in a fresh process (Ray started, actors load the judge, rows scored, OUTPUT written): the
wall time includes actor start-up, as a user's run would. Writes benchmarks/results/ray_scaling_<device>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TOWNS = [
    "Lindford",
    "Ostby",
    "Harlow",
    "Kessel",
    "Brenton",
    "Tamsk",
    "Orrin",
    "Vale",
    "Corby",
    "Mossgiel",
    "Ashby",
    "Wendon",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judges", default="1,2")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--gpus-per-judge", type=float, default=0)
    args = ap.parse_args()
    work = RESULTS / "runs" / "ray_scaling"
    work.mkdir(parents=True, exist_ok=True)
    src = work / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "source": f"The council of {TOWNS[i % 12]} voted on Tuesday to "
                    f"build a library. Work will begin in March and cost {i + 2} million pounds.",
                    "summary": f"{TOWNS[i % 12]} will build a library.",
                }
            )
            + "\n"
            for i in range(args.rows)
        )
    )
    cpus = os.cpu_count() or 1
    rows = []
    for n in [int(x) for x in args.judges.split(",")]:
        out = work / f"out_{n}.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "offline_sumscore",
            "score",
            str(src),
            "-o",
            str(out),
            "--engine",
            "ray",
            "--num-judges",
            str(n),
            "--cpus-per-judge",
            str(max(1, cpus // n)),
            "--gpus-per-judge",
            str(args.gpus_per_judge),
            "--chunk-size",
            "2",
            "--max-questions",
            "1",
            "--max-claims",
            "2",
            "--max-text-chars",
            "40",
            "--no-reason",
            "--no-cache",
            "--quiet",
        ]
        if args.model:
            cmd += ["--model", args.model]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, RAY_DISABLE_USAGE_STATS="1"))
        seconds = time.perf_counter() - started
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{n} judges failed: {proc.stderr[-2000:]}")
        rows.append(
            {
                "judges": n,
                "cpus_per_judge": max(1, cpus // n),
                "seconds": round(seconds, 1),
                "rows_per_s": round(args.rows / seconds, 4),
            }
        )
        print(f"{n} judges: {seconds:.1f} s, {args.rows / seconds:.3f} rows/s", file=sys.stderr)
    base = rows[0]["rows_per_s"]
    for r in rows:
        r["x_one_judge"] = round(r["rows_per_s"] / base, 2)
    device = "gpu" if args.gpus_per_judge else "cpu"
    table = ["| judges (actors) | CPUs each | wall s | rows/s | x one judge |", "|---|---|---|---|---|"]
    table += [
        f"| {r['judges']} | {r['cpus_per_judge']} | {r['seconds']} | {r['rows_per_s']} | {r['x_one_judge']} |"
        for r in rows
    ]
    md = (
        f"# Ray: one judge against more, {device}\n\n{args.rows} rows, chunks of 2, {cpus} CPUs, judge "
        f"{args.model or 'embedded SmolLM2-135M'}; wall time end to end (Ray start, actors loading the judge, "
        f"scoring, OUTPUT written).\n\n" + "\n".join(table) + "\n"
    )
    (RESULTS / f"ray_scaling_{device}.md").write_text(md)
    (RESULTS / f"ray_scaling_{device}.json").write_text(
        json.dumps({"rows": rows, "n_rows": args.rows, "cpus": cpus}, indent=1) + "\n"
    )
    print(md)


if __name__ == "__main__":
    main()
