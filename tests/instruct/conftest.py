"""The instruct tier: the design users run, on Qwen2.5-Coder-1.5B-Instruct, the default judge (`make setup` fetches
it). Behaviour that depends on judging well is asserted here, never exact scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import pytest

INSTRUCT_JUDGE = "qwen2.5-coder-1.5b"
DEMO = resources.files("offline_sumscore") / "examples" / "demo.jsonl"


@pytest.fixture(scope="session")
def instruct_judge():
    from offline_sumscore.engine.judge import load_judge

    # Absent, this fails with the one line that says how to get it: the tier never skips silently.
    return load_judge(INSTRUCT_JUDGE)


@pytest.fixture(scope="session")
def default_cli_demo(tmp_path_factory):
    """`sumscore score` on the demo's three rows as a user runs it: no --model (the suite names the fast judge in the
    environment; this run removes it, as a user's shell has nothing there), no cache. Returns the rows by id and the
    run's peak resident memory in bytes. One run serves the CLI's checks and the design's (minutes of the 1.5B)."""
    out = tmp_path_factory.mktemp("default_cli") / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "OFFLINE_SUMSCORE_JUDGE"}
    # A Python of its own runs the score and reports its children's peak resident memory: pytest's own children
    # (other tests' runs) would otherwise count in the maximum.
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(done.returncode)"
    )
    score = [sys.executable, "-m", "offline_sumscore", "score", str(DEMO), "-o", str(out), "--no-cache"]
    done = subprocess.run([sys.executable, "-c", measure, *score], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    return rows, int(done.stderr.strip().splitlines()[-1]) * 1024
