"""The GPU benchmark's code path on the CPU: Llama-3.1-8B's geometry cut to one layer, random weights.

A device call is short and cannot be repeated at will, so what it runs must be known to work: the ladder writes its
results after every rung (a run cut short keeps them), runs the full engine first, reports NaN counts, and says why
no vLLM rung ran.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_ladder_writes_the_full_engine_first_and_keeps_it_when_cut_short(tmp_path):
    out = tmp_path / "throughput_gpu"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.throughput",
            "--config",
            "gpu",
            "--allow-cpu",
            "--layers",
            "1",
            "--vocab",
            "0",
            "--samples",
            "1",
            "--questions",
            "1",
            "--rungs",
            "7,V7,0",
            "--shared-rungs",
            "",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.time() + 600
        for line in proc.stderr:  # stop the run as soon as its first rung is reported, as a device timeout would
            if line.startswith("standard rung 7 ") or time.time() > deadline:
                break
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    report = json.loads(Path(f"{out}.json").read_text())
    (row,) = report["rows"]  # rung 0 never finished: what was measured is kept
    assert row["rung"] == "7" and row["failed_rows"] == 0 and row["nan_values"] == 0 and row["nan_rows"] == 0
    assert report["engine"]["attention"] == "offline_sumscore_ragged"
    assert "| standard | 7 |" in Path(f"{out}.md").read_text()
    # vLLM's rung was asked for but runs with --config cpu only: the report says so, whether or not vLLM is
    # importable here (it used to say "not importable" whatever the reason)
    assert "--config cpu only" in report["vllm"] and "not importable" not in report["vllm"]
