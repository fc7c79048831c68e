"""A soak run through the CLI: thousands of rows, resident memory and seconds per row as the run goes, one kill.

    python -m benchmarks.soak                                   # 5,000 embedded-design rows, 1,000 generating ones
    python -m benchmarks.soak --embedded 500 --generating 100   # a shorter look

Rows are made here, distinct (town, project, month, amount; a third of the summaries with a changed number), and
scored by `sumscore score` in its own process, in chunks (checkpointed as a user's run is), without the stage cache.
Every few seconds the process's resident memory (VmRSS) and the rows in OUTPUT are read. Reported per design: memory
at each tenth of the run, its growth over the second half (a plateau: within noise), and seconds per row by
quarter (they must not grow).

The generating design (decoded verdicts: where a row's company in a batch could move a verdict) is then run again
and killed once with SIGKILL at a random moment (seeded) between a fifth and four fifths of the first run's wall
time, resumed with --resume, and compared with the first (uninterrupted) run: every row once, none lost, verdicts
equal (`--kill embedded` kills the other design's run instead).
Writes benchmarks/results/NAME.{md,json,png} (--name, default soak_cpu); runs go to results/runs/soak/ (git-ignored).
`--table-from NAME.json` writes the table and plot of a saved run again.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.row_diff import differing_rows, verdict_flips
from benchmarks.lib.soak_rows import make_rows

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PACE_WINDOW = 4  # chunks the plotted pace is taken over
# The generating design: the judge writes its coverage questions and decodes Yes/No verdicts with reasons (the
# throughput ladder's design; the embedded judge cannot list atomic claims, which end at their bound).
GENERATING = ["--claims", "sentences", "--coverage", "questions", "--verdicts", "yes-no", "--max-questions", "3"]
GENERATING += ["--max-text-chars", "120", "--max-reason-chars", "60"]


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rows_in(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.endswith(b"\n"))
    except FileNotFoundError:
        return 0


def run(src: Path, out: Path, flags: list[str], *, every: float, kill_after: float | None = None, resume=False):
    """One `sumscore score` process: samples (seconds, rows in OUTPUT, RSS MiB) every `every` seconds; SIGKILL after
    kill_after seconds where given. Returns the samples and the process's exit code."""
    cmd = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), "--quiet", "--no-cache"]
    cmd += ["--chunk-size", "50", *flags, *(["--resume"] if resume else [])]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = []
    while proc.poll() is None:
        time.sleep(every)
        now = time.perf_counter() - started
        memory = rss_mib(proc.pid)
        if memory is not None:
            samples.append({"seconds": round(now, 1), "rows": rows_in(out), "rss_mib": round(memory, 1)})
        if kill_after is not None and now >= kill_after:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
    stdout, stderr = proc.communicate()
    if proc.returncode not in (0, 1, -signal.SIGKILL):
        raise SystemExit(f"sumscore failed ({proc.returncode}): {stderr[-2000:]}")
    return samples, proc.returncode, time.perf_counter() - started


def profile(samples: list[dict], total: int) -> dict:
    """Memory at each tenth of the rows, its growth over the second half (last minus first, and a least-squares
    slope per 100 rows), and seconds per row by quarter. Memory is read while rows are still being scored: once
    OUTPUT holds every row the run is closing (the final rewrite in input order, the judge freed), and a reading
    then says nothing of the run (one, 2 GB below the rest, made the second half look like it shrank)."""
    scored = [s for s in samples if s["rows"] > 0]
    running = [s for s in scored if s["rows"] < total] or scored
    half = [s for s in running if s["rows"] >= total / 2]
    tenths = []
    for k in range(1, 11):
        at = next((s for s in running if s["rows"] >= total * k / 10), running[-1] if running else None)
        tenths.append(at["rss_mib"] if at else None)
    reached = arrivals(scored)
    quarters = []
    for q in range(4):
        lo, hi = total * q / 4, total * (q + 1) / 4
        part = [a for a in reached if lo <= a["rows"] <= hi]
        if len(part) >= 2:
            quarters.append((part[-1]["seconds"] - part[0]["seconds"]) / (part[-1]["rows"] - part[0]["rows"]))
        else:
            quarters.append(None)
    second = [s["rss_mib"] for s in half]
    return {
        "rss_mib_by_tenth": tenths,
        "rss_mib_peak": max((s["rss_mib"] for s in samples), default=None),
        "second_half_growth_mib": round(second[-1] - second[0], 1) if len(second) >= 2 else None,
        "second_half_mib_per_100_rows": slope_per_100_rows(half),
        "second_half_spread_mib": round(max(second) - min(second), 1) if second else None,
        "seconds_per_row_by_quarter": [round(q, 4) if q else None for q in quarters],
    }


def arrivals(samples: list[dict]) -> list[dict]:
    """The first sample at each count of rows in OUTPUT: when a chunk's rows arrived. Rows arrive a chunk at a
    time, so a pace taken between any two samples counts the wait for the next chunk at one end or the other (up to
    a chunk's time, a fifth of a quarter of the generating run)."""
    out: list[dict] = []
    for s in samples:
        if not out or s["rows"] > out[-1]["rows"]:
            out.append(s)
    return out


def slope_per_100_rows(samples: list[dict]) -> float | None:
    """Least-squares slope of resident memory against rows in OUTPUT, in MiB per 100 rows."""
    if len({s["rows"] for s in samples}) < 2:
        return None
    xs, ys = [s["rows"] for s in samples], [s["rss_mib"] for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return round(100 * slope, 2)


def soak(name: str, rows: list[dict], flags: list[str], work: Path, every: float) -> dict:
    src, out = work / f"{name}.jsonl", work / f"{name}_out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.unlink(missing_ok=True)
    samples, code, seconds = run(src, out, flags, every=every)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    result = {"design": name, "rows": len(rows), "exit_code": code, "seconds": round(seconds, 1)}
    result.update(rows_written=len(written), failed=sum(bool(r.get("error")) for r in written))
    result.update(profile(samples, len(rows)), samples=samples)
    print(f"{name}: {len(written)} rows in {seconds:.0f} s, peak RSS {result['rss_mib_peak']} MiB", flush=True)
    return result


def kill_and_resume(name: str, flags: list[str], work: Path, reference: dict, every: float, seed: int) -> dict:
    """The same run killed once at a random moment and resumed; OUTPUT compared with the uninterrupted run's."""
    src, out = work / f"{name}.jsonl", work / f"{name}_killed.jsonl"
    out.unlink(missing_ok=True)
    moment = random.Random(seed).uniform(0.2, 0.8) * reference["seconds"]
    first, code, _ = run(src, out, flags, every=every, kill_after=moment)
    kept = rows_in(out)
    second, code2, _ = run(src, out, flags, every=every, resume=True)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    expected = [json.loads(line) for line in (work / f"{name}_out.jsonl").read_text().splitlines()]
    flips, verdicts = verdict_flips(got, expected)
    ids = [r["id"] for r in got]
    result = {
        "killed_after_seconds": round(moment, 1),
        "kill_exit_code": code,
        "rows_in_output_at_kill": kept,
        "resume_exit_code": code2,
        "rows": len(got),
        "duplicated": len(ids) - len(set(ids)),
        "lost": len({r["id"] for r in expected} - set(ids)),
        "verdict_flips": flips,
        "verdicts": verdicts,
        "rows_differing_timing_aside": len(differing_rows(got, expected)),
        "samples_before_kill": first,
        "samples_after_resume": second,
    }
    print(f"{name} killed at {moment:.0f} s with {kept} rows written: {result}", flush=True)
    return result


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        running = [s for s in r["samples"] if 0 < s["rows"] < r["rows"]]  # as the table: not once the run closes
        axes[0].plot([s["rows"] for s in running], [s["rss_mib"] for s in running], label=r["design"])
        reached = arrivals([s for s in r["samples"] if s["rows"] > 0])
        pace = [  # over the last PACE_WINDOW chunks, between the moments their rows arrived
            (b["rows"], (b["seconds"] - a["seconds"]) / (b["rows"] - a["rows"]))
            for a, b in zip(reached, reached[PACE_WINDOW:])
        ]
        axes[1].plot([x for x, _ in pace], [y for _, y in pace], label=r["design"], linewidth=0.8)
    axes[0].set(xlabel="rows in OUTPUT", ylabel="resident memory (MiB)", title="memory")
    axes[1].set(xlabel="rows in OUTPUT", ylabel="seconds per row", title=f"pace, over {PACE_WINDOW} chunks")
    for ax in axes:
        ax.legend()
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _mib(value: float | None, sign: str = "") -> str:
    return "-" if value is None else f"{value:{sign}.0f}"


def table(results: list[dict], killed: dict | None, name: str = "soak_cpu") -> str:
    lines = ["# Soak: thousands of rows through `sumscore score` (embedded judge, CPU)", ""]
    lines += [
        "| design | rows | wall s | failed | peak RSS MiB | RSS at each tenth of the rows (MiB) | "
        "second half: growth / spread MiB | second half: MiB per 100 rows | s per row by quarter |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tenths = " ".join(f"{x:.0f}" for x in r["rss_mib_by_tenth"] if x is not None)
        pace = " / ".join(f"{q:.3f}" if q else "-" for q in r["seconds_per_row_by_quarter"])
        lines.append(
            f"| {r['design']} | {r['rows_written']} of {r['rows']} | {r['seconds']:.0f} | {r['failed']} | "
            f"{r['rss_mib_peak']:.0f} | {tenths} | {_mib(r['second_half_growth_mib'], '+')} / "
            f"{_mib(r['second_half_spread_mib'])} | {r.get('second_half_mib_per_100_rows', '-')} | {pace} |"
        )
    if killed:
        lines += [
            "",
            f"The {killed['design']} run again, killed once (SIGKILL) after "
            f"{killed['killed_after_seconds']:.0f} s with "
            f"{killed['rows_in_output_at_kill']} rows in OUTPUT, then resumed: {killed['rows']} rows, "
            f"{killed['duplicated']} duplicated, {killed['lost']} lost, {killed['verdict_flips']} of "
            f"{killed['verdicts']} verdicts moved against the uninterrupted run, "
            f"{killed['rows_differing_timing_aside']} rows differing timing aside.",
        ]
    lines += ["", f"![memory and pace]({name}.png)", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedded", type=int, default=5000, help="rows on the embedded (likelihood) design")
    ap.add_argument("--generating", type=int, default=1000, help="rows on the generating design")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="soak_cpu", help="the results' file name in benchmarks/results/")
    ap.add_argument(
        "--kill", choices=["generating", "embedded", "none"], default="generating", help="whose run to kill"
    )
    ap.add_argument("--table-from", type=Path, default=None, help="a saved NAME.json: its table and plot again")
    args = ap.parse_args()
    if args.table_from is not None:
        saved = json.loads(args.table_from.read_text())
        for r in saved["results"]:
            r.update(profile(r["samples"], r["rows"]))
        write(saved["results"], saved["kill_resume"], args.name)
        return
    work = RESULTS / "runs" / "soak"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    if args.embedded:
        results.append(soak("embedded", make_rows(args.embedded), [], work, args.every))
    if args.generating:
        results.append(soak("generating", make_rows(args.generating), GENERATING, work, args.every))
    killed = None
    reference = next((r for r in results if r["design"] == args.kill), None)
    if reference is not None:
        flags = GENERATING if args.kill == "generating" else []
        killed = kill_and_resume(args.kill, flags, work, reference, args.every, args.seed)
        killed["design"] = args.kill
    write(results, killed, args.name)


def write(results: list[dict], killed: dict | None, name: str) -> None:
    (RESULTS / f"{name}.json").write_text(json.dumps({"results": results, "kill_resume": killed}, indent=1) + "\n")
    plot(results, RESULTS / f"{name}.png")
    (RESULTS / f"{name}.md").write_text(table(results, killed, name))
    print(table(results, killed, name))


if __name__ == "__main__":
    main()
