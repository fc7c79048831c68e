"""Bulk runs that never lose a finished row.

Here, every row not yet in OUTPUT goes through the engine as one stream (ScorerBase.stream): at most in_flight
samples at a time, a new one starting the moment one finishes, so no sample waits for another's slow row. Each row
is appended to OUTPUT, flushed and fsynced, the moment it is final: OUTPUT grows in the order rows finish (with a
7-8B judge a chunk of 32 rows took many minutes, and a run stopped before its first chunk was whole kept nothing). A
row is in OUTPUT whole or, after a crash mid-write, as a torn tail that a resumed run cuts off and redoes. A resumed
run scores only the rows not in OUTPUT; its batches are formed from where it starts, so they can differ from an
uninterrupted run's (batch composition can move a verdict through padding numerics; the flip rate is measured in
benchmarks/kill_resume.py). At the end OUTPUT is rewritten in input order, one row per input row, atomically (a
temporary file, fsync, rename). A pool of workers (offline_sumscore.runs.ray_pool) scores whole chunks of chunk_size
rows instead (counted from the top of the file), yielding them in any order, each appended whole.

A row is matched to OUTPUT by its key ("id:<id>", or "line:<n>" when the row names no id) and the hash of its
content; a key whose content changed is an error, never silently reused. A row that failed because the judge's
engine or server failed (cause "<stage>:model": a server stopped mid-run, a device error) is not done: a resumed
run scores it again. Other failures (an output that does not validate, bad input) would fail again, and are kept.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offline_sumscore.analysis.calibration import is_likelihood_row, one_sided_run
from offline_sumscore.core.errors import Failure, InputError, UsageError, WriteError, check_count
from offline_sumscore.core.results import FailedRow
from offline_sumscore.core.samples import BadRow, Sample, checked_sample, source_hash
from offline_sumscore.runs.record import RecordRows, Span, append_whole, dumps, finished_rows, rewrite
from offline_sumscore.scorers.stages.likelihood import LIKELIHOOD_RULE

DEFAULT_CHUNK_SIZE = 32


def bad_row(item: BadRow, metric: str = "") -> dict:
    """The OUTPUT row of an input row that cannot be scored: its input error and where it came from."""
    row = FailedRow.bad_input(item.error, id=item.given_id, metric=metric).to_dict()
    row = dict(row, line=item.line, row_key=item.key, input_hash=item.input_hash)
    if item.columns is not None:
        row["input"] = item.columns
    return row


@dataclass
class BulkReport:
    rows: Sequence[dict]  # the final OUTPUT, in input order: read from the file as they are asked for (RecordRows)
    resumed: int = 0  # rows taken from OUTPUT as they were
    torn_tail: bool = False  # a torn last line was found in OUTPUT and cut off
    stopped_early: bool = False  # fail_fast stopped the run at a failed row
    failed_by_cause: Counter = field(default_factory=Counter)


Chunk = list  # the input rows (Sample | BadRow) of one chunk, in input order
ChunkScorer = Callable[[list[tuple[int, Chunk]]], Iterator[tuple[int, list[dict]]]]


def stream_rows_here(
    scorer, pending: list, emit: Callable[[list, list[dict]], None], in_flight: int | None = None
) -> None:
    """Score the pending rows' Samples as one stream; emit(items, rows) each row the moment it is final (the bad
    rows first, together)."""
    bad = [item for item in pending if isinstance(item, BadRow)]
    if bad:
        emit(bad, [bad_row(item, scorer.metric) for item in bad])
    samples = [item for item in pending if isinstance(item, Sample)]

    def done(i: int, outcome) -> None:
        emit([samples[i]], [_with_origin(samples[i], outcome.to_dict())])

    if samples:
        scorer.stream(samples, done, in_flight=in_flight)


class _StopRun(Exception):
    """fail_fast: a written chunk holds a failed row."""


def score_samples(scorer, chunk: Chunk) -> list[dict]:
    samples = [item for item in chunk if isinstance(item, Sample)]
    return [r.to_dict() for r in scorer.score_many(samples, on_error="return")] if samples else []


def score_table(
    scorer,
    ids: list[str],
    sources: list,
    summaries: list,
    *,
    source_field: str = "source",
    summary_field: str = "summary",
    numbered: bool = False,
) -> list[dict]:
    """One result row per table row (a DataFrame's, a Ray batch's), in order: each row's texts checked as a file's
    are, so a bad row fails alone with its input error and never reaches the judge; the others scored together.
    numbered: errors name the row's number from 1 as its line."""
    samples, failed = [], {}
    for i, row_id in enumerate(ids):
        try:
            samples.append(
                checked_sample(
                    row_id,
                    sources[i],
                    summaries[i],
                    source_field=source_field,
                    summary_field=summary_field,
                    line=i + 1 if numbered else None,
                )
            )
        except InputError as exc:
            failed[i] = FailedRow.bad_input(exc, id=row_id, metric=scorer.metric).to_dict()
    scored = iter(score_samples(scorer, samples))
    return [failed[i] if i in failed else next(scored) for i in range(len(ids))]


def chunk_rows(chunk: Chunk, results: list[dict], metric: str) -> list[dict]:
    """The OUTPUT rows of a chunk: each Sample's result (in order) and each BadRow's input error, in input order."""
    results_iter = iter(results)
    return [
        bad_row(item, metric) if isinstance(item, BadRow) else _with_origin(item, next(results_iter)) for item in chunk
    ]


def _with_origin(item: Sample, result: dict) -> dict:
    # The id as INPUT gave it, with its JSON type; null for a row that gave none (its line says which).
    result.update(
        id=item.given_id,
        line=item.line,
        row_key=item.key,
        input_hash=item.input_hash,
        source_hash=source_hash(item.source),
    )
    if item.doc_id is not None:
        result["doc_id"] = item.doc_id
    if item.columns is not None:
        result["input"] = item.columns  # the user's fields, untouched, apart from ours: no name of theirs can clash
    return result


def run_bulk(
    items: Sequence[Sample | BadRow],
    scorer,
    output: str | os.PathLike,
    *,
    resume: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    fail_fast: bool = False,
    progress: Callable[[int], None] | None = None,
    score_chunks: ChunkScorer | None = None,
    in_flight: int | None = None,
    notify: Callable[[str], None] | None = None,
) -> BulkReport:
    """Score items into OUTPUT (JSONL), every row appended the moment it is final; see the module docstring for the
    guarantees.

    score_chunks: how the chunks that are not done get scored (default: here, row by row as one stream of at most
    in_flight samples, None: as many as the engine asks for); it may yield them in any order, as a pool of workers
    finishes them (offline_sumscore.runs.ray_pool). notify(message): told, on a resumed run, how many rows OUTPUT
    kept and how many are left to score."""
    check_count("chunk_size", chunk_size)
    started = time.time()
    path = Path(output)
    done: dict[str, Span] = {}  # each finished row's place in the record: a long run holds no rows
    report = BulkReport(rows=[])
    if resume and path.exists():
        check = _resumable(items, scorer, path)
        sound, report.torn_tail = finished_rows(path, lambda row, span: check(row, span, done))
        with open(path, "r+b") as fh:  # cut a torn tail, so the next append starts on a fresh line
            fh.truncate(sound)
            fh.flush()
            os.fsync(fh.fileno())
    report.resumed = sum(item.key in done for item in items)
    chunks = [list(items[start : start + chunk_size]) for start in range(0, len(items), chunk_size)]
    todo = [(k, chunk) for k, chunk in enumerate(chunks) if not all(item.key in done for item in chunk)]
    pending = [item for item in items if item.key not in done]
    if resume and notify:
        notify(f"resuming {path}: {report.resumed} rows kept from it, {len(pending)} to score")
    if progress:
        progress(len(items) - (len(pending) if score_chunks is None else sum(len(chunk) for _, chunk in todo)))
    try:
        out = open(path, "ab" if resume else "wb", buffering=0)  # unbuffered: a failed write leaves nothing pending
    except OSError as exc:
        raise WriteError(path, exc) from None
    with out:

        def write(written: list, rows: list[dict]) -> None:
            # Wall-clock facts of the run that wrote the row: a report adds up each run's span (resumed runs too)
            stamp = {"run_started": round(started, 3), "written": round(time.time(), 3)}
            for row in rows:
                row["timing"] = stamp
            lines = [dumps(r) for r in rows]
            offset = append_whole(out, b"".join(lines), len(done))
            for item, line in zip(written, lines):
                done[item.key] = (offset, len(line))  # a row redone after a torn write: the later copy wins
                offset += len(line)
            if progress:
                progress(len(written))
            if fail_fast and any(r.get("error") for r in rows):
                raise _StopRun

        try:
            if score_chunks is None:
                stream_rows_here(scorer, pending, write, in_flight)
            else:
                for k, rows in score_chunks(todo):
                    write(chunks[k], rows)
        except _StopRun:
            report.stopped_early = True
    finished = RecordRows(path, [done[item.key] for item in items if item.key in done])
    said = one_sided_run(finished)  # written into the rows' settings as OUTPUT is rewritten (mark_one_sided)
    report.rows, report.failed_by_cause = rewrite(path, finished, lambda row: mark_one_sided(row, said))
    return report


def _resumable(items, scorer, path: Path) -> Callable[[dict, Span, dict], None]:
    """check(row, span, done): a row of OUTPUT that --resume keeps goes into done (its key -> its place); a row from
    another INPUT, other content, other options or another version's likelihood rule is an error."""
    wanted = {item.key: item for item in items}

    def check(row: dict, span: Span, done: dict[str, Span]) -> None:
        item = wanted.get(row["row_key"])
        if item is None:
            raise UsageError(
                f"{path} holds a row ({row['row_key']}) that is not in INPUT: it is another run's "
                f"OUTPUT; use a new -o, or drop --resume to start afresh"
            )
        if row.get("input_hash") != item.input_hash:
            raise UsageError(
                f"{path}: the row {row['row_key']} (line {row.get('line')}) was scored from different "
                f"content than INPUT has now; use a new -o, or drop --resume to rescore everything"
            )
        # The options as given must match; "design.*" keys record what "auto" resolved to for the judge.
        given = {k: v for k, v in (row.get("settings") or {}).items() if not k.startswith(("design.", "run."))}
        if row.get("metric") != scorer.metric or (given and given != scorer.settings):
            differ = sorted(k for k in set(given) | set(scorer.settings) if given.get(k) != scorer.settings.get(k))
            what = (
                f"metric {row.get('metric')}, not {scorer.metric}"
                if row.get("metric") != scorer.metric
                else "; ".join(f"{k} was {given.get(k)!r}, now {scorer.settings.get(k)!r}" for k in differ)
            )
            raise UsageError(
                f"{path} was written with other settings ({what}); resume with the same options, or use a new -o"
            )
        # A likelihood verdict's rule is this code's, not an option: a row judged under another version's rule would
        # sit beside new rows judged under this one, and they would not compare.
        rule = (row.get("settings") or {}).get("design.likelihood_rule")
        if rule is not None and rule != LIKELIHOOD_RULE:
            raise UsageError(
                f"{path}: the row {row['row_key']} (line {row.get('line')}) was judged under another likelihood rule "
                f"({rule!r}; this version's is {LIKELIHOOD_RULE!r}); use a new -o, or drop --resume to rescore "
                f"everything"
            )
        if not redo_on_resume(row):
            done[row["row_key"]] = span  # a chunk redone after a torn write: the later copy wins

    return check


def mark_one_sided(row: dict, said: str | None) -> None:
    """A run whose likelihood verdicts fall 95% or more on one side says so in each such row's settings
    ("run.one_sided"), beside the CLI's and the report's word for it: OUTPUT is rewritten once the run knows its
    share (rows are written chunk by chunk before it does). "run." keys are not options: resume ignores them."""
    if said and is_likelihood_row(row):
        row["settings"] = dict(row.get("settings") or {}, **{"run.one_sided": said})


def redo_on_resume(row: dict) -> bool:
    """A row the judge's engine or server failed (not the row itself): --resume scores it again."""
    return str((row.get("error") or {}).get("cause", "")).endswith(":" + Failure.MODEL)
