"""Input rows: Sample(id, source, summary, questions, line), and the JSONL/CSV readers.

Bad input raises InputError naming the file, line, id and field.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from .errors import InputError


@dataclass(frozen=True)
class Sample:
    id: str
    source: str
    summary: str
    questions: tuple[str, ...] | None = None  # user-supplied questions: skip question generation
    line: int | None = None


def check_text(value: Any, field: str, *, line: int | None = None, row_id: str | None = None,
               path: str | None = None) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string; got {type(value).__name__}", field=field, line=line,
                         row_id=row_id, path=path)
    if not value.strip():
        raise InputError("is empty or whitespace-only; each row needs text to judge", field=field, line=line,
                         row_id=row_id, path=path)
    return value


def as_sample(item: Any, index: int) -> Sample:
    """Accept a Sample, a (source, summary) pair or a dict with source/summary (and id, questions)."""
    if isinstance(item, Sample):
        return item
    if isinstance(item, dict):
        row_id = str(item.get("id", index))
        questions = item.get("questions")
        return Sample(id=row_id, source=check_text(item.get("source"), "source", row_id=row_id),
                      summary=check_text(item.get("summary"), "summary", row_id=row_id),
                      questions=tuple(questions) if questions is not None else None)
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return Sample(id=str(index), source=check_text(item[0], "source", row_id=str(index)),
                      summary=check_text(item[1], "summary", row_id=str(index)))
    raise InputError(f"item {index} must be a (source, summary) pair or a dict with source and summary; "
                     f"got {type(item).__name__}")


def read_samples(path: str | Path, *, source_field: str = "source", summary_field: str = "summary",
                 id_field: str = "id") -> Iterator[Sample]:
    """Read JSONL (.jsonl/.json) or CSV (.csv) rows as Samples, in file order."""
    path = Path(path)
    if not path.exists():
        raise InputError("does not exist", path=str(path))
    rows: Iterator[tuple[int, dict]]
    if path.suffix.lower() == ".csv":
        rows = _csv_rows(path, [source_field, summary_field])
    else:
        rows = _jsonl_rows(path)
    for line, row in rows:
        row_id = str(row[id_field]) if row.get(id_field) not in (None, "") else str(line)
        for field in (source_field, summary_field):
            if field not in row:
                raise InputError("is missing", field=field, line=line, row_id=row_id, path=str(path))
        questions = row.get("questions")
        if questions is not None and not (isinstance(questions, list) and all(isinstance(q, str) for q in questions)):
            raise InputError("must be a list of strings", field="questions", line=line, row_id=row_id, path=str(path))
        yield Sample(id=row_id, line=line,
                     source=check_text(row[source_field], source_field, line=line, row_id=row_id, path=str(path)),
                     summary=check_text(row[summary_field], summary_field, line=line, row_id=row_id, path=str(path)),
                     questions=tuple(questions) if questions else None)


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as fh:
        for line, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"is not valid JSON ({exc.msg})", line=line, path=str(path)) from None
            if not isinstance(row, dict):
                raise InputError("must be a JSON object", line=line, path=str(path))
            yield line, row


def _csv_rows(path: Path, needed: Sequence[str]) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [f for f in needed if f not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"CSV header lacks column(s) {', '.join(missing)}; it has "
                             f"{', '.join(reader.fieldnames or [])}", line=1, path=str(path))
        for row in reader:
            yield reader.line_num, row
