"""The table a CPU user reads to pick an engine: ours, vLLM's CPU build and llama.cpp's llama-server on each judge the
ladder has results for, built from the results files in benchmarks/results (the ladder's throughput_cpu*.json and
the memory runs' memory_peak_cpu.json), so that no figure in it is typed by hand. The cpu ladder appends it to
throughput_cpu.md whenever it writes that file; `python -m benchmarks.engine_choice` writes it there again after
another judge's ladder or a memory run. Each ratio is of two engines timed in the same run, never across runs."""

from __future__ import annotations

import json
from pathlib import Path

HEADING = "## Which engine on this CPU"
# judge as the tables name it -> its ladder results, the most recent run with every engine first
JUDGES = {
    "SmolLM2-135M Q4_1 (embedded)": ("throughput_cpu.json",),
    "Qwen2.5-Coder-1.5B-Instruct Q4_K_M": (
        "throughput_cpu_qwen2.5-coder-1.5b_bf16_rows.json",
        "throughput_cpu_qwen2.5-coder-1.5b.json",
        "throughput_cpu_llamacpp_qwen2.5-coder-1.5b.json",
    ),
}
ENGINES = {"7": "ours", "V": "vLLM (CPU build)", "L": "llama-server"}
WORKLOADS = ("standard", "shared", "bulk")


def ladder_rows(results: Path, files: tuple[str, ...]) -> dict:
    """(workload, rung) -> (its row, our full engine's row of the same run, the file, that run's report), each
    from the first file that has both."""
    found = {}
    for name in files:
        path = results / name
        if not path.exists():
            continue
        report = json.loads(path.read_text())
        rows = {(r["workload"], r["rung"]): r for r in report["rows"]}
        for (workload, rung), row in rows.items():
            if rung in ENGINES and (workload, "7") in rows and (workload, rung) not in found:
                found[(workload, rung)] = (row, rows[(workload, "7")], name, report)
    return found


def agreement(workload: str, rung: str, row: dict, report: dict) -> str:
    """How far the engine's verdicts agree with ours in that run: vLLM's verdicts (the same questions drawn, the
    numerics nearly the same), llama.cpp's claims (its questions are its own draws)."""
    if rung == "V" and row.get("flip_rate_vs_ours") is not None:
        return f"{100 * (1 - row['flip_rate_vs_ours']):.1f}% of verdicts"
    if rung == "L":
        alike = ((report.get("llamacpp") or {}).get("agreement") or {}).get(workload)
        if alike and alike.get("claims_compared"):
            return f"{100 * alike['claims_agree']:.1f}% of {alike['claims_compared']} claims"
    return "-"


def memory_rows(results: Path) -> list[dict]:
    path = results / "memory_peak_cpu.json"
    if not path.exists():
        return []
    return [r for r in json.loads(path.read_text())["runs"] if not r["engine"].endswith("before")]


def section(results: Path) -> str:
    lines = [
        HEADING,
        "",
        "Built from the results files beside this one by `benchmarks/lib/engine_choice.py`: samples a second; "
        "prompt tokens a second (those each engine computed; for llama-server those sent, part served by its "
        "prompt cache); tokens decoded a second; ours over each engine (samples/s over samples/s, the two timed in "
        "the same run); and how far its verdicts agree with ours.",
        "",
        "| judge | workload | engine | samples/s | prompt tok/s | decoded tok/s | ours x it | verdicts alike with ours "
        "| run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for judge, files in JUDGES.items():
        found = ladder_rows(results, files)
        for workload in WORKLOADS:
            first = found.get((workload, "7"), (None, None, None))[2]  # the run our own row comes from
            for rung, engine in ENGINES.items():
                if (workload, rung) not in found:
                    continue
                row, ours, name, report = found[(workload, rung)]
                ratio = "-" if rung == "7" else f"**{ours['samples_per_s'] / row['samples_per_s']:.2f}x**"
                if rung != "7" and name != first:  # another run's: its ratio is to ours in that run
                    ratio += f" (ours {ours['samples_per_s']:.3f} in that run)"
                lines.append(
                    f"| {judge} | {workload}, {row['samples']} samples | {engine} | {row['samples_per_s']:.3f} | "
                    f"{row['prefill_tok_per_s']:.0f} | {row['decoded_tok_per_s']:.1f} | {ratio} | "
                    f"{agreement(workload, rung, row, report)} | `{name.removesuffix('.json')}` |"
                )
    memory = memory_rows(results)
    if memory:
        lines += [
            "",
            "Peak memory of `sumscore score` on twelve rows, one a 2,559-word source (`memory_peak_cpu.md`): memory "
            "in use (PSS), and the kernel's resident maximum, which counts a page once per address it is mapped at "
            "(ours maps one copy of a shared prefix into each row's slot). vLLM's was not read this way: its "
            "worker's resident memory was 7.3-7.7 GB by `ps` during the 1.5B's ladder.",
            "",
            "| judge | engine | peak in use | resident maximum |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['judge']} | {r['engine']} | {r['peak_pss_gib']:.2f} GiB | {r['max_vmhwm_gib']:.2f} GiB |"
            for r in memory
        ]
    return "\n".join(lines) + "\n"


def rewrite(markdown: Path, results: Path) -> None:
    """The file's section replaced by one built now (appended where it has none); it stays the file's last."""
    text = markdown.read_text()
    kept = text.split(HEADING)[0].rstrip("\n")
    markdown.write_text(kept + "\n\n" + section(results))
