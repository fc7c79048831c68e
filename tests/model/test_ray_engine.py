"""Scoring on a local Ray (2 CPUs) with two actors, each holding the embedded judge: the same rows and verdicts as
one process, and every row once when an actor is killed mid-run. Skipped, loudly, where ray is not installed."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.lib.row_diff import without_timing
from offline_sumscore.io.inputs import read_rows
from offline_sumscore.runs.bulk import run_bulk
from tests.model.test_bulk_on_embedded_judge import ROWS

pytestmark = pytest.mark.model
ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'offline-sumscore[ray]'")

# Yes/No verdicts with decoded reasons: each chunk takes seconds, so an actor can be killed while it scores (the
# embedded defaults decode nothing and would finish first).
CAPS = {
    "claims": "sentences",
    "coverage": "key_sentences",
    "key_sentences": 2,
    "verdicts": "yes-no",
    "max_reason_chars": 60,
}
FLAGS = "--claims sentences --coverage key_sentences --key-sentences 2 --verdicts yes-no --max-reason-chars 60".split()
FLAGS += ["--no-cache", "--chunk-size", "2", "--quiet"]


def split_probabilities(rows):
    """Rows without their read-off probabilities (P(yes), soft scores), and those probabilities in order. An actor
    runs torch on fewer threads than one process, so float sums differ in the last digits; verdicts may not."""
    probs = []

    def strip(x):
        if isinstance(x, dict):
            kept = {}
            for k, v in x.items():
                if k.startswith(("p_", "soft_")) or k in ("p_yes", "pmi"):
                    probs.extend(v if isinstance(v, list) else [v])
                else:
                    kept[k] = strip(v)
            return kept
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(without_timing(rows)), probs


def same_rows(got, expected):
    (a, pa), (b, pb) = split_probabilities(got), split_probabilities(expected)
    assert a == b  # claims, verdicts, questions, scores, reasons: exactly the same
    assert len(pa) == len(pb) and all(
        (x is None) == (y is None) and (x is None or abs(x - y) < 1e-4) for x, y in zip(pa, pb)
    )


def actor_pids() -> set[int]:
    """The processes whose title names the pool's actor class (Ray titles an actor's process after it)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ChunkActor" in (proc / "cmdline").read_bytes():
                found.add(int(proc.name))
        except OSError:  # it ended while we looked
            continue
    return found


def cli(src, out, *extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_DISABLE_USAGE_STATS="1")
    return subprocess.run(
        [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), *FLAGS, *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = cli(src, tmp / "local.jsonl")
    assert run.returncode == 0, run.stderr[-2000:]
    return src, [json.loads(line) for line in (tmp / "local.jsonl").read_text().splitlines()]


def test_two_ray_actors_give_exactly_the_rows_of_one_process(tmp_path, one_process):
    src, expected = one_process
    run = cli(src, tmp_path / "ray.jsonl", "--engine", "ray", "--num-judges", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    got = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert [r["id"] for r in got] == [r["id"] for r in ROWS]  # input order, each row once
    same_rows(got, expected)
    assert run.stdout.splitlines()[0].startswith(f"metric two-axis: {len(ROWS)} rows, 0 failed")


def test_a_killed_actor_is_retried_and_every_row_arrives_once(tmp_path, one_process):
    from offline_sumscore import SummarizationScorer
    from offline_sumscore.runs.ray_pool import score_chunks_on_ray

    src, expected = one_process
    config = {"metric": "two-axis", "model": None, "options": CAPS, "cache": None}
    seen, killed, running = set(), [], threading.Event()
    running.set()

    def watch_and_kill_one_actor():
        """Find the actors' processes by the title Ray gives them (ray::...ChunkActor...), kill one with SIGKILL once
        both run and have had a few seconds, and keep watching, so that its replacement is seen too."""
        deadline, both_seen = time.time() + 300, None
        while running.is_set() and time.time() < deadline:
            seen.update(actor_pids())
            if both_seen is None and len(seen) >= 2:
                both_seen = time.time()
            if not killed and both_seen and time.time() - both_seen > 4:
                victim = min(seen)  # the actors are loading the judge or scoring their first chunks
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
            time.sleep(0.2)

    killer = threading.Thread(target=watch_and_kill_one_actor, daemon=True)
    killer.start()
    try:
        report = run_bulk(
            list(read_rows(src)),
            SummarizationScorer(**CAPS),
            tmp_path / "out.jsonl",
            chunk_size=2,
            score_chunks=score_chunks_on_ray(config, num_judges=2, max_retries=3),
        )
    finally:
        running.clear()
        ray.shutdown()
    killer.join(5)
    assert killed, "no actor was killed: the test proved nothing"
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in got] == [r["id"] for r in ROWS] and len(report.rows) == len(ROWS)
    same_rows(got, expected)
    assert len(seen) >= 3  # a replacement actor started


def test_score_dataset_rejects_bad_rows_exactly_as_the_local_run_does():
    import pandas as pd

    from offline_sumscore.runs.frame import score_frame
    from offline_sumscore.runs.ray_pool import score_dataset

    source = "The council of Lindford voted on Tuesday to build a new library on Mill Street."
    items = [
        {"id": "good", "source": source, "summary": "Lindford will build a library."},
        {"id": "empty", "source": source, "summary": "   "},
        {"id": "none", "source": None, "summary": "A summary of nothing."},
    ]
    config = {"metric": "two-axis", "options": {"key_sentences": 1}}
    local = score_frame(pd.DataFrame(items), id="id", key_sentences=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        got = {r["id"]: r for r in score_dataset(ray.data.from_items(items), config, batch_size=3).take_all()}
    finally:
        ray.shutdown()
    for k, item in enumerate(items):
        error = got[item["id"]]["error"]
        error = json.loads(error) if isinstance(error, str) else error
        expected = local["error"][k]
        assert (error is None) == (expected is None or expected != expected), (item["id"], error, expected)
        if item["id"] == "none":
            assert error["cause"] == expected["cause"] and error["field"] == expected["field"]
            assert got[item["id"]]["score"] is None
    assert got["good"]["score"] is not None
    # An empty summary is a result, not a bad row: 0 with its reason, on both paths
    assert got["empty"]["score"] == local["score"][1] == 0 and got["empty"]["empty_summary"]
