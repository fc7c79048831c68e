"""kill -9 at random moments, then --resume: rows lost, duplicated or changed against an uninterrupted run.

    python -m benchmarks.kill_resume --trials 3      # embedded judge, 6 rows, chunks of 2

One uninterrupted run gives the reference; each trial starts the same run (its own fresh stage cache), kills it with
SIGKILL at a moment drawn uniformly over the reference's wall time (so kills land in model loading, mid-chunk and
mid-write), resumes it, and compares OUTPUT with the reference row by row, timing fields aside, and verdict by
verdict: a resumed run streams its rows in other company than the uninterrupted run, which can move a P(yes) by float
noise and, at a near tie, a verdict.
Writes benchmarks/results/kill_resume_cpu.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

from benchmarks.lib.row_diff import verdict_flips, without_timing

# The bundled council rows, and the flags of tests/model/test_bulk_on_embedded_judge.py: Yes/No verdicts with decoded
# reasons, so that a chunk takes seconds and a kill can land while the run is still going.
COUNCIL = resources.files("offline_sumscore") / "examples" / "council.jsonl"  # six council decisions
ROWS = [json.loads(line) for line in COUNCIL.read_text().splitlines()]
CAPS = "--claims sentences --coverage key_sentences --key-sentences 2 --verdicts yes-no --max-reason-chars 60".split()

RESULTS = Path(__file__).resolve().parent / "results"


def command(src, out):
    return [
        sys.executable,
        "-m",
        "offline_sumscore",
        "score",
        str(src),
        "-o",
        str(out),
        "--quiet",
        "--chunk-size",
        "2",
        "--in-flight",
        "2",
        *CAPS,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = RESULTS / "runs" / "kill_resume"
    if work.exists():
        import shutil

        shutil.rmtree(work)  # a cache left from an earlier run would make the reference run cached, not real
    work.mkdir(parents=True)
    src = work / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = lambda cache: dict(os.environ, OFFLINE_SUMSCORE_CACHE=str(cache), HF_HUB_OFFLINE="1")  # noqa: E731
    started = time.perf_counter()
    subprocess.run(
        command(src, work / "reference.jsonl"), env=env(work / "ref.sqlite"), check=True, capture_output=True
    )
    reference_s = time.perf_counter() - started
    reference = without_timing([json.loads(x) for x in (work / "reference.jsonl").read_text().splitlines()])
    # The same run again on the filled cache: how much of it the cache answers, and how long it takes.
    started = time.perf_counter()
    rerun = subprocess.run(
        command(src, work / "rerun.jsonl"), env=env(work / "ref.sqlite"), check=True, capture_output=True, text=True
    )
    rerun_s = time.perf_counter() - started
    cache_line = next((x for x in rerun.stdout.splitlines() if x.startswith("stage cache")), "no cache line")
    rerun_same = without_timing([json.loads(x) for x in (work / "rerun.jsonl").read_text().splitlines()]) == reference
    rng = random.Random(args.seed)
    trials = []
    for t in range(args.trials):
        out, cache = work / f"trial{t}.jsonl", work / f"trial{t}.sqlite"
        upper = reference_s
        while True:  # a run that finished before its kill time proves nothing: draw an earlier moment and redo
            for stale in (out, cache):
                stale.unlink(missing_ok=True)
            at = rng.uniform(1.0, upper)
            proc = subprocess.Popen(
                command(src, out), env=env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(at)
            finished_first = proc.poll() is not None
            if not finished_first:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if not finished_first:
                break
            upper = at * 0.8
        before = out.read_bytes() if out.exists() else b""
        rows_before = before.count(b"\n")
        torn = bool(before) and not before.endswith(b"\n")
        subprocess.run(command(src, out) + ["--resume"], env=env(cache), check=True, capture_output=True)
        got = [json.loads(x) for x in out.read_text().splitlines()]
        ids = [r["id"] for r in got]
        trial = {
            "kill_at_s": round(at, 1),
            "killed": not finished_first,
            "rows_written_before_kill": rows_before,
            "torn_last_line": torn,
            "rows_lost": len({r["id"] for r in ROWS} - set(ids)),
            "rows_duplicated": len(ids) - len(set(ids)),
            "rows_differing": sum(a != b for a, b in zip(without_timing(got), reference)),
            "verdicts_differing": verdict_flips(got, reference)[0],
            "verdicts": verdict_flips(got, reference)[1],
            "in_input_order": ids == [r["id"] for r in ROWS],
        }
        trials.append(trial)
        print(json.dumps(trial), file=sys.stderr)
    lines = [
        f"# kill -9 then --resume, embedded judge, {len(ROWS)} rows, chunks of 2",
        "",
        f"Reference run {reference_s:.1f} s; each trial killed at a uniform random moment of that span.",
        "",
        f"Re-run on the filled stage cache: {rerun_s:.1f} s, rows identical: {rerun_same}; {cache_line}.",
        "",
        "| trial | killed at s | rows written before | torn last line | rows lost | duplicated | rows differing "
        "(any field but time) | verdicts differing | in order |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {i} | {t['kill_at_s']} | {t['rows_written_before_kill']} | {t['torn_last_line']} | {t['rows_lost']} | "
        f"{t['rows_duplicated']} | {t['rows_differing']} | {t['verdicts_differing']} of {t['verdicts']} | "
        f"{t['in_input_order']} |"
        for i, t in enumerate(trials)
    ]
    (RESULTS / "kill_resume_cpu.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "kill_resume_cpu.json").write_text(
        json.dumps(
            {
                "reference_s": reference_s,
                "trials": trials,
                "rerun_s": rerun_s,
                "rerun_identical": rerun_same,
                "rerun_cache": cache_line,
            },
            indent=1,
        )
        + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
