"""The GPU check (benchmarks/gpu_check.py) rehearsed on the CPU, as make test runs it: every section's code runs
through the engine's GPU branches on an emulated GPU (OFFLINE_SUMSCORE_DEVICE_MEMORY), so the day a GPU is lent its
few minutes are not spent on a check that cannot run. What only the real device shows (speed, CUDA's own sync count,
bfloat16 kernels) is what the rows say they are."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_rehearsed_on_the_cpu_runs_every_section_and_writes_one_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OFFLINE_SUMSCORE_DEVICE_MEMORY"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--rehearse", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=dict(env, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = report["rows"]
    sections = {r["section"] for r in rows}
    assert sections == {"env", "families", "syncs", "memory", "attention", "ladder"}
    assert not [r for r in rows if r["ok"] is False]
    assert len([r for r in rows if r["section"] == "families"]) == 7
    assert any("memory taken after sizing: 31 of 31 answered" in f"{r['check']}: {r['figures']}" for r in rows)
    ladder = {r["check"].split(":")[0]: r["figures"] for r in rows if r["section"] == "ladder"}
    assert {"ours", "transformers generate"} <= set(ladder) and "rows held" in ladder["ours"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.startswith("# GPU check: CPU rehearsal, an emulated GPU of") and "| families | gemma-2 | ok |" in table
