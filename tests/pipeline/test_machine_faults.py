"""What the machine does never ends a run badly, on a scripted judge (fixed replies: no model): a full disk under
OUTPUT or a report, a stage cache that cannot be opened, read or written, and a second run on an OUTPUT that another
run holds. Each ends in one clear line (no traceback), loses no finished row, and `--resume` (or a plain rerun, for
the cache) finishes the work.

The full disk is real where this machine lets a test mount a small tmpfs (root, as CI runs); an injected ENOSPC
checks the same path everywhere."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main
from offline_sumscore.core.run_lock import run_lock
from offline_sumscore.engine.stage_cache import StageCache
from tests.conftest import SOURCE, write_jsonl

PMI_ROWS = 48
LIKELIHOOD = ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1"]
LIKELIHOOD += ["--verdicts", "likelihood", "--quiet"]


def enqueue(scripted, n: int):
    """n rows of one claim and one key sentence each, every verdict a supported likelihood."""
    for _ in range(n):
        scripted.enqueue("support", {"mean_logprob": -2.0, "tokens": 4})
        scripted.enqueue("coverage", {"mean_logprob": -2.0, "tokens": 4})
        scripted.enqueue("baseline", {"mean_logprob": -5.0, "tokens": 4}, {"mean_logprob": -5.0, "tokens": 4})


def rows(n: int) -> list[dict]:
    return [{"id": f"r{k}", "source": SOURCE, "summary": f"Lindford will build a library, item {k}."} for k in range(n)]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().decode().splitlines()]  # a torn line would raise


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB filesystem (tmpfs), grown to 4 MiB by the test's grow(); skipped where mounting is not allowed."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.decode().strip()}); the injected ENOSPC test runs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def grow(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)


def score(src: Path, out: str | Path, *extra: str):
    return CliRunner().invoke(main, ["score", str(src), "-o", str(out), *LIKELIHOOD, *extra])


def test_output_on_a_full_disk_ends_in_one_line_keeps_every_written_row_and_resume_finishes(
    tmp_path, small_disk, use_scripted
):
    src = write_jsonl(tmp_path / "in.jsonl", rows(PMI_ROWS))
    out = small_disk / "out.jsonl"
    enqueue(use_scripted, PMI_ROWS)
    result = score(src, out, "--chunk-size", "4", "--no-cache")
    assert result.exit_code == 4, result.output
    assert "Traceback" not in result.output and result.exception.__class__ is SystemExit
    (said,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert f"cannot write {out}: No space left on device (ENOSPC)" in said and "--resume" in said
    kept = lines(out)  # every line whole: the row whose write failed was cut back
    assert 0 < len(kept) < PMI_ROWS and f"the {len(kept)} rows written before it" in said
    assert not Path(f"{out}.lock").exists()
    grow(small_disk)
    enqueue(use_scripted, PMI_ROWS - len(kept))
    again = score(src, out, "--chunk-size", "4", "--no-cache", "--resume")
    assert again.exit_code == 0, again.output
    finished = lines(out)
    assert [r["id"] for r in finished] == [f"r{k}" for k in range(PMI_ROWS)]  # every row once, in order
    # the rows kept are the rows written, untouched (a run of all-supported verdicts marks run.one_sided at the end)
    assert [dict(r, settings=None) for r in finished[: len(kept)]] == [dict(r, settings=None) for r in kept]


def test_a_full_disk_under_a_csv_output_or_a_report_says_which_file(tmp_path, small_disk, use_scripted):
    src = write_jsonl(tmp_path / "in.jsonl", rows(8))
    enqueue(use_scripted, 8)
    ok = score(src, tmp_path / "out.jsonl", "--no-cache")
    assert ok.exit_code == 0, ok.output
    (small_disk / "filler").write_bytes(b"x" * (60 << 10))
    page = small_disk / "report.html"
    result = CliRunner().invoke(main, ["report", str(tmp_path / "out.jsonl"), "-o", str(page)])
    assert result.exit_code == 4 and result.output.startswith(f"Error: cannot write {page}: No space left")
    assert not page.exists() and not list(small_disk.glob("report.html.*"))  # no half page left behind


def test_an_injected_enospc_mid_run_is_the_same_one_line_and_resume_finishes(tmp_path, use_scripted, monkeypatch):
    import offline_sumscore.runs.bulk as bulk

    calls = {"n": 0}
    real = os.fsync

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] == 9:  # the ninth row's write (each row is written the moment it is final)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(bulk.os, "fsync", fsync)
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(12)), tmp_path / "out.jsonl"
    enqueue(use_scripted, 12)
    result = score(src, out, "--chunk-size", "4", "--no-cache")
    assert result.exit_code == 4 and "the 8 rows written before it are intact" in result.output
    assert [r["id"] for r in lines(out)] == [f"r{k}" for k in range(8)]  # the ninth row's bytes were cut
    monkeypatch.setattr(bulk.os, "fsync", real)
    enqueue(use_scripted, 4)
    again = score(src, out, "--chunk-size", "4", "--no-cache", "--resume")
    assert again.exit_code == 0 and [r["id"] for r in lines(out)] == [f"r{k}" for k in range(12)]


def test_a_stage_cache_on_a_full_disk_warns_once_and_the_run_goes_on(tmp_path, small_disk, use_scripted):
    (small_disk / "filler").write_bytes(b"x" * (60 << 10))
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(8)), tmp_path / "out.jsonl"
    enqueue(use_scripted, 8)
    result = score(src, out, "--cache", str(small_disk / "stages.sqlite"))
    assert result.exit_code == 0, result.output
    assert result.output.count("warning: the stage cache") == 1 and "the run goes on" in result.output
    assert len(lines(out)) == 8


def test_a_corrupt_cache_is_moved_aside_and_a_fresh_one_used(tmp_path, use_scripted):
    cache = tmp_path / "stages.sqlite"
    cache.write_bytes(os.urandom(8192))
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(4)), tmp_path / "out.jsonl"
    enqueue(use_scripted, 4)
    result = score(src, out, "--cache", str(cache))
    assert result.exit_code == 0, result.output
    assert "was not a readable stage cache" in result.output and "moved aside" in result.output
    (aside,) = tmp_path.glob("stages.sqlite.corrupt-*")
    assert len(aside.read_bytes()) == 8192 and len(StageCache(cache)) > 0 and len(lines(out)) == 4
    rerun = score(src, tmp_path / "again.jsonl", "--cache", str(cache))  # the fresh cache answers everything
    assert rerun.exit_code == 0 and "warning" not in rerun.output and "100%" in rerun.output


def test_a_cache_whose_folder_cannot_be_made_is_skipped_with_a_warning(tmp_path, use_scripted):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder should be")
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(2)), tmp_path / "out.jsonl"
    enqueue(use_scripted, 2)
    result = score(src, out, "--cache", str(blocker / "stages.sqlite"))
    assert result.exit_code == 0 and "cannot be opened" in result.output and str(blocker) in result.output
    assert len(lines(out)) == 2
    # The closing line does not credit the file with what it never answered.
    assert "0 of 8 stage requests answered from it (0%)" in result.output
    assert "sent to the judge; the cache was off after the warning above" in result.output


def test_identical_requests_in_flight_are_counted_apart_from_the_cache_file(tmp_path, use_scripted):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's folder should be")
    same = [dict(rows(1)[0], id=name) for name in ("a", "b")]  # one summary twice: every request asked twice
    src, out = write_jsonl(tmp_path / "in.jsonl", same), tmp_path / "out.jsonl"
    enqueue(use_scripted, 1)
    result = score(src, out, "--cache", str(blocker / "stages.sqlite"))
    assert result.exit_code == 0 and len(lines(out)) == 2, result.output
    said = next(line for line in result.output.splitlines() if line.startswith("stage cache"))
    assert "0 of 8 stage requests answered from it (0%), 4 the same as one in flight (computed once), 4 sent" in said


def _hold_write_lock(path: str, ready, release) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    ready.set()
    release.wait(30)
    db.execute("ROLLBACK")


def test_a_cache_locked_by_another_process_past_the_timeout_is_read_only_with_a_warning(tmp_path, scripted):
    from offline_sumscore import SummarizationScorer

    path = tmp_path / "stages.sqlite"
    StageCache(path).close()
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_write_lock, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        said = []
        cache = StageCache(path, warn=said.append, timeout=0.2)
        enqueue(scripted, 1)
        design = dict(claims="sentences", coverage="key_sentences", key_sentences=1, verdicts="likelihood")
        result = SummarizationScorer(engine=scripted, cache=cache, **design).score(SOURCE, "Lindford builds.")
        assert result.score is not None and len(said) == 1 and "cannot be written" in said[0]
    finally:
        release.set()
        holder.join(30)


def test_a_second_run_on_an_output_another_run_holds_is_refused_at_once(tmp_path, use_scripted):
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(2)), tmp_path / "out.jsonl"
    with run_lock(f"{out}.lock", str(out)):
        result = score(src, out, "--no-cache")
    assert result.exit_code == 2 and "is being written by another run" in result.output
    assert f"process {os.getpid()} on" in result.output and "started 20" in result.output
    assert not out.exists() and not use_scripted.requests  # refused before anything was scored


def _lock_and_wait(lock: str, out: str, ready) -> None:
    with run_lock(lock, out):
        ready.set()
        signal.pause()


def test_a_lock_left_by_a_run_killed_with_sigkill_does_not_block_the_next(tmp_path, use_scripted):
    src, out = write_jsonl(tmp_path / "in.jsonl", rows(2)), tmp_path / "out.jsonl"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    dead = ctx.Process(target=_lock_and_wait, args=(f"{out}.lock", str(out), ready))
    dead.start()
    assert ready.wait(30)
    os.kill(dead.pid, signal.SIGKILL)
    dead.join(30)
    assert Path(f"{out}.lock").exists()  # the file stays behind; its lock died with the process
    enqueue(use_scripted, 2)
    result = score(src, out, "--no-cache")
    assert result.exit_code == 0, result.output
    assert len(lines(out)) == 2 and not Path(f"{out}.lock").exists()


def test_a_bulk_run_holds_where_its_rows_lie_not_the_rows(tmp_path, use_scripted):
    # Memory that grows with every row written ends a run of tens of thousands: the run keeps each row's place in
    # its record and reads rows back only when asked (the soak benchmark measures the plateau this gives).
    from offline_sumscore.cli.app import run_table
    from offline_sumscore.runs.files import score_file
    from offline_sumscore.runs.record import RecordRows

    src, out = write_jsonl(tmp_path / "in.jsonl", rows(10)), tmp_path / "out.jsonl"
    enqueue(use_scripted, 10)
    design = dict(claims="sentences", coverage="key_sentences", key_sentences=1, verdicts="likelihood")
    run = score_file(src, out, options=design, chunk_size=3)
    assert isinstance(run.report.rows, RecordRows) and len(run.report.rows.spans) == 10
    assert [r["id"] for r in run.report.rows] == [f"r{k}" for k in range(10)] == [r["id"] for r in lines(out)]
    assert run.report.rows[3] == lines(out)[3]
    table = run_table("two-axis", run.report.rows, 1.0)
    # coverage is the key sentence's P(covered), sigmoid(3.0 - 2.0) = 0.73 (the embedded design's soft coverage)
    assert "metric two-axis: 10 rows, 0 failed" in table and "lowest 5 of 10:\n  0.730  r0: The score is 0.73" in table
