"""`sumscore score` without --model scores with the 1.5B (the suite names the fast judge in the environment; this test
removes it, as a user's shell has nothing there), and its peak memory stays under 4 GB: the judge holds its GGUF's
block codes, never a float copy of its weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model


def test_score_without_a_model_uses_the_default_instruct_judge(tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        json.dumps(
            {
                "id": "thin",
                "source": "Heavy rain flooded parts of Ostby overnight. About 200 homes were evacuated.",
                "summary": "It rained in Ostby.",
            }
        )
        + "\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OFFLINE_SUMSCORE_JUDGE"}
    out = tmp_path / "out.jsonl"
    # A Python of its own runs the score and reports its children's peak resident memory: pytest's own children
    # (other tests' runs) would otherwise count in the maximum.
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(done.returncode)"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, "-m", "offline_sumscore", "score", str(rows), "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak_kib = int(done.stderr.strip().splitlines()[-1])
    assert peak_kib * 1024 < 4e9, f"peak {peak_kib} KiB"
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["judge"]["name"] == "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    assert row["questions"] and row["coverage"] < 1.0
