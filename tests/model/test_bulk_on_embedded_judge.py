"""Bulk-run guarantees on the real embedded judge: kill -9 and resume, the stage cache, determinism across batch
sizes, hostile text. Each test takes a minute or two.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from importlib import resources

import pytest

from benchmarks.lib.row_diff import verdict_flips, without_timing
from offline_sumscore import FailedRow, SummarizationScorer, SummaryScore
from offline_sumscore.engine.local import TransformersEngine
from tests.conftest import as_in_a_terminal
from tests.unit.test_hostile_text import HOSTILE

pytestmark = pytest.mark.model

COUNCIL = resources.files("offline_sumscore") / "examples" / "council.jsonl"  # six council decisions
ROWS = [json.loads(line) for line in COUNCIL.read_text().splitlines()]
# Yes/No verdicts with decoded reasons: a chunk takes seconds (the embedded defaults decode nothing and take a
# fraction of one), so a kill can land while the run is still going.
CAPS = "--claims sentences --coverage key_sentences --key-sentences 2 --verdicts yes-no --max-reason-chars 60".split()


def sumscore(src, out, cache, *extra, wait=True, started_as=as_in_a_terminal):
    env = dict(os.environ, OFFLINE_SUMSCORE_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    # Two rows in flight: chunks of two finish one after another, so a kill can land between them.
    cmd = [
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
        *extra,
    ]
    if not wait:
        return subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=started_as
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def rows_of(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_kill_9_then_resume_gives_every_row_once_and_a_cached_rerun_is_free(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    rows = ROWS  # three chunks of two: killed after the first
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole = sumscore(src, tmp_path / "whole.jsonl", tmp_path / "cache-a.sqlite")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    expected = without_timing(rows_of(tmp_path / "whole.jsonl"))

    # The same run with the cache filled: not one stage request reaches the judge, and the rows are the same.
    again = sumscore(src, tmp_path / "again.jsonl", tmp_path / "cache-a.sqlite")
    assert again.returncode == 0 and ", 0 sent to the judge" in again.stdout, again.stdout
    assert without_timing(rows_of(tmp_path / "again.jsonl")) == expected

    # Killed with SIGKILL at a random moment after its first chunk was written, then resumed.
    out = tmp_path / "killed.jsonl"
    proc = sumscore(src, out, tmp_path / "cache-b.sqlite", wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        time.sleep(0.2)
    # A random moment within the next second: the last four rows take about four seconds on a 2-core machine.
    time.sleep(random.Random(os.getpid()).uniform(0, 1))
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = out.read_bytes().count(b"\n")
    assert 2 <= written < len(rows)
    resumed = sumscore(src, out, tmp_path / "cache-b.sqlite", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "rows kept from OUTPUT" in resumed.stdout
    got = rows_of(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows]  # every row once, in input order: none lost
    assert not any(r.get("error") for r in got)
    # The resumed run streams its rows in other company than the uninterrupted run did, which can move a P(yes)
    # by float noise and, at a near tie, a verdict (measured: benchmarks/kill_resume.py).
    flips, total = verdict_flips(got, expected)
    with capsys.disabled():
        print(f"\nkill -9 and --resume: {flips} of {total} verdicts differ from the uninterrupted run")
    assert flips <= 0.1 * total


def test_sigterm_keeps_the_rows_says_so_and_resume_finishes(tmp_path):
    """SIGTERM mid-run (SIGINT's own handler is tested below, on a run started with SIGINT ignored, and on a served
    judge in tests/pipeline/test_interrupts.py: the same path keeps the rows)."""
    sig, code, word = signal.SIGTERM, 143, "terminated"
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "out.jsonl"
    proc = sumscore(src, out, tmp_path / "cache.sqlite", wait=False)
    deadline = time.time() + 300
    while time.time() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 2):
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(sig)
    text = proc.communicate(timeout=120)[0]
    kept = out.read_bytes().count(b"\n")
    assert proc.returncode == code and "Traceback" not in text and "Aborted!" not in text
    assert f"{word}: {kept} rows kept in {out}; rerun the same command with --resume to finish" in text
    resumed = sumscore(src, out, tmp_path / "cache.sqlite", "--resume")
    assert resumed.returncode == 0 and len(rows_of(out)) == len(ROWS)


def test_a_run_started_with_sigint_ignored_still_stops_at_sigint_keeping_its_rows(tmp_path):
    """A script's background job inherits SIGINT ignored (a shell without job control starts it so): the run installs
    its own handler, so SIGINT ends it within seconds, as Ctrl-C does in a terminal, keeping the rows it finished."""
    demo = (resources.files("offline_sumscore") / "examples" / "demo.jsonl").read_text().splitlines()
    rows = [dict(json.loads(line), id=f"{json.loads(line)['id']}-{n}") for n in range(4) for line in demo]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def sigint_ignored():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = sumscore(
        src, out, tmp_path / "cache.sqlite", "--model", "smollm2-135m", wait=False, started_as=sigint_ignored
    )
    deadline = time.time() + 300
    while time.time() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    interrupted = time.time()
    proc.send_signal(signal.SIGINT)
    text = proc.communicate(timeout=60)[0]
    took = time.time() - interrupted
    kept = out.read_bytes().count(b"\n")
    assert proc.returncode == 130 and took < 10 and "Traceback" not in text, (proc.returncode, took, text)
    assert 1 <= kept < len(rows) and f"interrupted: {kept} rows kept in {out}" in text
    got = rows_of(out)  # finished rows, in the order they finished (the run puts them in input order at its end)
    assert len({r["id"] for r in got}) == kept and {r["id"] for r in got} <= {r["id"] for r in rows}
    assert all(r["score"] is not None for r in got)


def test_verdict_flip_rate_across_batch_sizes_is_measured(judge, capsys):
    samples = [
        dict(
            r,
            key_facts=[re.search(r"Work will begin in \w+", r["source"]).group() + ".", "Residents welcomed the plan."],
        )
        for r in ROWS[:4]
    ]
    runs = {}
    for batch_size in (1, 3, 64):
        scorer = SummarizationScorer(engine=TransformersEngine(judge, batch_size=batch_size), include_reason=False)
        runs[batch_size] = scorer.score_many(samples)

    def verdicts(results):
        return [
            v
            for r in results
            for v in [c["supported"] for c in r.claims] + [v["answered"] for v in r.coverage_verdicts]
        ]

    base = verdicts(runs[1])
    flips = {b: sum(x != y for x, y in zip(base, verdicts(runs[b]))) for b in (3, 64)}
    assert all(len(verdicts(runs[b])) == len(base) for b in runs)
    with capsys.disabled():
        print(
            f"\nverdict flips against batch size 1 over {len(base)} verdicts: "
            + ", ".join(f"batch {b}: {n} ({100 * n / len(base):.1f}%)" for b, n in flips.items())
        )
    # Padding changes float sums slightly; on these inputs that has never moved a greedy verdict. A flip would
    # show here, with its rate, rather than pass unseen.
    assert all(n / len(base) <= 0.1 for n in flips.values()), flips


def test_hostile_text_leaves_every_output_valid(judge):
    rows = [
        {
            "id": f"h{i}",
            "source": ROWS[i % len(ROWS)]["source"] + " " + text,
            "summary": ROWS[i % len(ROWS)]["summary"] + " " + text,
        }
        for i, text in enumerate(HOSTILE)
    ]
    start = judge.tokenizer.convert_tokens_to_ids("<|im_start|>")
    two_axis = SummarizationScorer(judge)  # the embedded defaults: likelihood verdicts
    yes_no = SummarizationScorer(judge, claims="sentences", verdicts="yes-no", include_reason=False)
    summary_score = SummaryScore(judge, max_questions=2, max_keyphrases=3, max_text_chars=60, answers="questions")
    # Every hostile text through the two-axis stages; two of them through the yes-no verdicts and summary-score's
    # JSON stages (their prompts fence the same way, and each real-model row costs seconds here).
    # The 135M's keyphrases are the prompt's own kinds, a failed stage (degenerate): its JSON is checked all the same.
    for scorer, batch in ((two_axis, rows), (yes_no, rows[:2]), (summary_score, rows[2:4])):
        for result in scorer.score_many([dict(r) for r in batch], on_error="return"):
            assert not isinstance(result, FailedRow) or result.error["cause"] == "keyphrases:degenerate"
            for stage in result.stages.values():
                assert stage["error"] is None or stage["error_kind"] == "degenerate"
                if scorer is summary_score:
                    json.loads(stage["raw_output"])  # valid JSON whatever the text asked for
                elif scorer is yes_no:
                    assert stage["raw_output"] in ("Yes", "No")
                ids = judge.tokenizer(stage["prompt"], add_special_tokens=False)["input_ids"]
                assert ids.count(start) == 3  # system, user, assistant: no turn forged by the data


def test_demo_started_with_sigint_ignored_stops_at_sigint_in_one_line():
    """Every command installs its own SIGINT handler, not only `score`: the demo, interrupted while it scores, ends
    within seconds with 130 and one line (click's own "Aborted!" exits 1)."""

    def sigint_ignored():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    cmd = [sys.executable, "-m", "offline_sumscore", "demo", "--metric", "two-axis", "--model", "smollm2-135m"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_ignored
    )
    said = ""
    while "loaded in" not in said:  # the judge is loaded: scoring starts now
        line = proc.stdout.readline()
        assert line, f"the demo ended before it could be interrupted: {said}"
        said += line
    interrupted = time.time()
    proc.send_signal(signal.SIGINT)
    said += proc.communicate(timeout=30)[0]
    took = time.time() - interrupted
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, said)
    assert "interrupted: demo stopped" in said and "Traceback" not in said and "Aborted!" not in said, said
