"""OUTPUT's record: the JSONL file a bulk run appends its rows to, a chunk at a time, and reads back by place.

A run of any length holds where each row lies in the record (its offset and length), never the rows themselves:
RecordRows reads them back when they are asked for, so a run's memory does not grow with its rows. A chunk is
appended whole or not at all (append_whole cuts back what a failed write left), and the final rewrite in input
order streams from the old record into the new one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from offline_sumscore.core.durable import replace_file
from offline_sumscore.core.errors import UsageError, WriteError

Span = tuple[int, int]  # a row's offset in the record and its length in bytes, newline included


def dumps(row: dict) -> bytes:
    # default=str: a Parquet input's dates and decimals, kept among the row's input fields, are written as text
    line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError:  # undecodable input bytes (kept as lone surrogates) in an id: write them escaped
        return (json.dumps(row, default=str) + "\n").encode("ascii")


class RecordRows(Sequence):
    """Rows of a record, read from the file at the places given, in that order, each time they are asked for."""

    def __init__(self, path: str | os.PathLike, spans: list[Span]):
        self.path, self.spans = Path(path), spans

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, at):
        if isinstance(at, slice):
            return RecordRows(self.path, self.spans[at])
        offset, length = self.spans[at]
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            return json.loads(fh.read(length))

    def __iter__(self) -> Iterator[dict]:
        with open(self.path, "rb") as fh:
            for offset, length in self.spans:
                fh.seek(offset)
                yield json.loads(fh.read(length))


def finished_rows(path: Path, on_row: Callable[[dict, Span], None]) -> tuple[int, bool]:
    """Each row already in OUTPUT, with its place, handed to on_row as the file is read (line by line: a long run's
    record is never read whole); returns the byte length of its sound part and whether a torn last line was found (a
    write cut off by a kill: no newline, or not valid JSON). Anything wrong before the last line is an error: that
    file was not written by this tool."""
    sound, pending = 0, None
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if pending is not None:  # the bad line was not the last one
                raise pending
            try:
                row = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                row = None
            if row is None or not isinstance(row, dict) or "row_key" not in row:
                pending = UsageError(
                    f"{path}:{number} is not a row written by `sumscore score` (no row_key); to resume, "
                    f"point -o at that run's OUTPUT, or drop --resume to start afresh"
                )
                if row is not None:
                    raise pending
                continue
            on_row(row, (sound, len(line)))
            sound += len(line)
    return sound, pending is not None


def finished_count(path: Path) -> int:
    """How many whole rows OUTPUT's record holds (what a run cut short has kept)."""
    count = 0

    def one(row: dict, span: Span) -> None:
        nonlocal count
        count += 1

    finished_rows(path, one)
    return count


def read_finished(path: Path) -> tuple[list[dict], int, bool]:
    """The rows already in OUTPUT (all of them, in memory: for a small record), its sound length, and whether a
    torn last line was found (finished_rows)."""
    rows: list[dict] = []
    sound, torn = finished_rows(path, lambda row, span: rows.append(row))
    return rows, sound, torn


def append_whole(out, data: bytes, rows_before: int) -> int:
    """Append data to OUTPUT's record and make it durable, returning the offset it starts at; where that fails (no
    space, a file size limit, an I/O error), cut the part that did reach the file, so that the record ends on its last
    whole row, and raise WriteError, which says so and how to finish."""
    before = out.tell()
    try:
        view = memoryview(data)
        while view:
            view = view[out.write(view) :]
        os.fsync(out.fileno())
    except OSError as exc:
        try:
            os.ftruncate(out.fileno(), before)
            out.seek(before)
        except OSError:
            pass  # a torn tail that could not be cut: --resume cuts it
        raise WriteError(
            out.name,
            exc,
            f"the {rows_before} rows written before it are intact; free space (or mend the cause) and rerun the same "
            "command with --resume to finish",
        ) from None
    return before


def rewrite(path: Path, rows: RecordRows, change: Callable[[dict], None]) -> tuple[RecordRows, Counter]:
    """The record again, holding `rows` in their order (each passed through change first), atomically, streamed
    from the old file into the new one; returns the rows at their new places and the failed rows by cause. Where it
    cannot be written, the record stays as it was, every row in it, and the error says so."""
    spans: list[Span] = []
    failed: Counter = Counter()

    def write(tmp: Path) -> None:
        spans.clear()
        failed.clear()
        offset = 0
        with open(tmp, "wb") as out:
            for row in rows:
                change(row)
                if row.get("error"):
                    failed[row["error"].get("cause", row["error"].get("stage", "?"))] += 1
                data = dumps(row)
                out.write(data)
                spans.append((offset, len(data)))
                offset += len(data)

    try:
        replace_file(path, write, suffix=".rewrite")
    except OSError as exc:
        raise WriteError(
            path,
            exc,
            f"all {len(rows)} rows are in it, in the order they finished; rerun the same command with --resume once "
            "the cause is gone, to put them in input order",
        ) from None
    return RecordRows(path, spans), failed
