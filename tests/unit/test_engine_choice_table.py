"""The engine-choice table (benchmarks/lib/engine_choice.py) from made-up results files: each ratio is of two engines
in the same run, a row from another run says so, agreement is read from that run, and rewriting the table leaves
the rest of throughput_cpu.md as it was."""

import json

from benchmarks.lib.engine_choice import HEADING, rewrite, section


def row(workload, rung, samples_per_s, **more):
    return {
        "workload": workload,
        "rung": rung,
        "samples": 6,
        "samples_per_s": samples_per_s,
        "prefill_tok_per_s": 100.0,
        "decoded_tok_per_s": 10.0,
        **more,
    }


def write(path, rows, llamacpp=None):
    path.write_text(json.dumps({"rows": rows, "llamacpp": llamacpp}))


def test_ratios_come_from_one_run_and_a_row_from_another_run_names_ours_in_it(tmp_path):
    agreement = {"standard": {"claims_compared": 15, "claims_agree": 0.8}}
    write(
        tmp_path / "throughput_cpu_qwen2.5-coder-1.5b.json",
        [row("standard", "7", 0.2), row("standard", "V", 0.1, flip_rate_vs_ours=0.05), row("standard", "L", 0.4)],
        {"agreement": agreement},
    )
    write(tmp_path / "throughput_cpu_llamacpp_qwen2.5-coder-1.5b.json", [row("bulk", "7", 0.3), row("bulk", "L", 0.1)])
    table = section(tmp_path)
    lines = {line.split(" | ")[1] + " " + line.split(" | ")[2]: line for line in table.splitlines() if "Qwen" in line}
    assert "**2.00x** | 95.0% of verdicts" in lines["standard, 6 samples vLLM (CPU build)"]
    assert "**0.50x** | 80.0% of 15 claims" in lines["standard, 6 samples llama-server"]
    bulk = lines["bulk, 6 samples llama-server"]  # ours has no bulk row in the first run: both from the second
    assert "**3.00x** |" in bulk and "in that run" not in bulk and "throughput_cpu_llamacpp" in bulk
    assert "SmolLM2" not in table  # no results for it here: no rows made up


def test_an_engine_missing_from_the_newest_run_is_taken_from_an_older_one_with_ours_there(tmp_path):
    write(tmp_path / "throughput_cpu_qwen2.5-coder-1.5b.json", [row("bulk", "7", 0.14), row("bulk", "V", 0.12)])
    older = [row("bulk", "7", 0.155), row("bulk", "L", 0.075)]
    write(tmp_path / "throughput_cpu_llamacpp_qwen2.5-coder-1.5b.json", older)
    line = next(x for x in section(tmp_path).splitlines() if "bulk" in x and "llama-server" in x)
    assert "**2.07x** (ours 0.155 in that run)" in line


def test_rewriting_replaces_the_section_and_keeps_the_ladders_own_report(tmp_path):
    write(tmp_path / "throughput_cpu.json", [row("standard", "7", 0.6), row("standard", "V", 0.5)])
    report = tmp_path / "throughput_cpu.md"
    report.write_text("# Throughput ladder\n\nthe ladder's table\n\n" + HEADING + "\n\nan old table\n")
    rewrite(report, tmp_path)
    rewrite(report, tmp_path)
    text = report.read_text()
    assert text.startswith("# Throughput ladder\n\nthe ladder's table\n\n" + HEADING)
    assert text.count(HEADING) == 1 and "an old table" not in text and "**1.20x**" in text
