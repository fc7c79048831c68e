"""Reading INPUT: JSONL, JSON arrays, CSV/TSV (optionally gzipped), Parquet, datasets save_to_disk directories and
folders of shards, every row checked as core.samples checks it.

read_rows yields one item per input row, in file order: a Sample, or a BadRow that says why the row cannot be
scored (naming its line, id and field). A bad row never stops the reader, so a bulk run can record it as failed
and go on. Only a problem with the whole file (missing, unreadable, a CSV header without the needed columns)
raises InputError. read_samples is the strict form for small inputs: it raises at the first bad row.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from offline_sumscore.core.errors import InputError, UsageError
from offline_sumscore.core.samples import (
    UNDECODABLE,
    BadRow,
    Sample,
    checked_sample,
    content_hash,
    is_empty_summary,
    judged_hash,
)


def need_module(module: str, extra: str = "formats"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"this format needs {module}: pip install 'offline-sumscore[{extra}]'") from None


def is_hf_dataset_dir(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists()


def table_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row dict) from a Parquet file or a save_to_disk directory."""
    if path.suffix.lower() == ".parquet":
        pq = need_module("pyarrow.parquet")
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise InputError(f"is not a readable Parquet file ({exc})", path=str(path), cause="bad_file") from None
    elif is_hf_dataset_dir(path):
        table = _read_hf_dir(path)
    else:
        raise InputError(
            "is a directory but not a Hugging Face datasets save_to_disk directory (no state.json "
            "and dataset_info.json)",
            path=str(path),
            cause="bad_file",
        )
    yield from enumerate(table.to_pylist(), 1)


def _read_hf_dir(path: Path):
    """The Arrow files a save_to_disk directory lists in state.json, concatenated in order. Reads with pyarrow
    alone, so the `datasets` package is not needed to score its output."""
    pa = need_module("pyarrow")
    state = json.loads((path / "state.json").read_text())
    files = [f["filename"] for f in state.get("_data_files", [])]
    if not files:
        raise InputError("state.json lists no data files", path=str(path), cause="bad_file")
    tables = []
    for name in files:
        with pa.memory_map(str(path / name)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables)


# -- writing ------------------------------------------------------------------------------------------------------


def read_rows(
    path: str | Path,
    *,
    source_field: str = "source",
    summary_field: str = "summary",
    id_field: str = "id",
    allow_long_summary: bool = False,
) -> Iterator[Sample | BadRow]:
    """Every row of a JSONL (.jsonl/.json), CSV (.csv) or Parquet (.parquet) file, or of a Hugging Face datasets
    save_to_disk directory, in order, as a Sample or a BadRow (line = row number for Parquet and datasets).

    A row is bad when: it is not valid JSON or not an object; a CSV row has more or fewer fields than the header;
    source or summary is missing, not a string, not valid UTF-8, or holds a control character; source is empty or
    whitespace-only (an empty summary is a row: it scores 0); questions is not a list of strings; its id repeats an
    earlier row's; or its summary is longer than its source (often swapped columns; allow_long_summary scores such
    rows anyway). Text in any script is fine.
    """
    path = Path(path)
    if not path.exists():
        raise InputError("does not exist", path=str(path), cause="missing_file")
    if path.is_dir() and not (path / "state.json").exists():
        yield from _shard_rows(
            path,
            source_field=source_field,
            summary_field=summary_field,
            id_field=id_field,
            allow_long_summary=allow_long_summary,
        )
        return
    where = str(path)
    rows = _raw_rows(path, {source_field: "--source-field", summary_field: "--summary-field"})
    # Ids keep their JSON type: 1 and "1" are two ids, and 8.5 comes back as 8.5. A row without an id is known by
    # its line, and its OUTPUT id is null, so no made-up id can equal a real one.
    first_seen: dict[str, int | None] = {}
    fields = (source_field, summary_field, id_field)
    for line, row in rows:
        yield _one_row(line, row, first_seen, where, fields, allow_long_summary)


def _raw_rows(path: Path, needed: Mapping[str, str]) -> Iterator[tuple[int, dict | InputError]]:
    """A file's rows as (line, dict), or (line, InputError) for a row that is not one; needed: a CSV's must-have
    columns, each with the flag that names it."""
    kind = input_kind(path)
    if kind in (".csv", ".tsv"):
        return _csv_rows(path, needed)
    if kind == ".parquet":
        return table_rows(path)  # Parquet and save_to_disk directories: rows numbered from 1
    return _jsonl_rows(path)


def read_field(path: str | Path, field: str, flag: str = "--label-field") -> dict[int, Any]:
    """One field of every row of a file (not a folder of shards), by line: what read_rows leaves out (a label)."""
    path = Path(path)
    return {line: row.get(field) for line, row in _raw_rows(path, {field: flag}) if isinstance(row, dict)}


# What people call each field, most likely first: the column a missing-field error proposes.
NAMES_BY_FLAG = {
    "--source-field": (
        "source",
        "article",
        "document",
        "text",
        "context",
        "passage",
        "content",
        "body",
        "transcript",
        "dialogue",
        "dialog",
        "input",
        "original",
        "reference",
    ),
    "--summary-field": (
        "summary",
        "summaries",
        "highlights",
        "abstract",
        "output",
        "response",
        "prediction",
        "generated",
        "candidate",
        "hypothesis",
    ),
    "--label-field": ("label", "labels", "consistent", "consistency", "faithful", "factual", "target", "gold"),
}


def closest_column(field: str, flag: str, columns: Sequence[str], taken: Sequence[str] = ()) -> str | None:
    """The column of `columns` most likely meant for `field`: a usual name for what flag names, else the most
    similar name; None where nothing is near. Columns already used for another field (taken) are not proposed."""
    import difflib

    free = [c for c in columns if c not in taken]
    by_name = {c.strip().lower(): c for c in free}
    for name in NAMES_BY_FLAG.get(flag, ()):
        if name in by_name:
            return by_name[name]
    near = difflib.get_close_matches(field, free, n=1, cutoff=0.6)
    return near[0] if near else None


def missing_hint(field: str, flag: str, columns: Sequence[str], taken: Sequence[str] = ()) -> str:
    """How to name the field that is missing: its flag, with the closest column where one is near."""
    near = closest_column(field, flag, columns, taken)
    return f"name the one that holds it with {flag}" + (f" (closest: {flag} {near})" if near else "")


def _one_row(line: int, row, first_seen: dict, where: str, fields: tuple[str, str, str], allow_long_summary: bool):
    """One row as a Sample, or a BadRow naming what is wrong with it (its id, then its fields); either keeps the
    row's fields as the file gave them (columns)."""
    if isinstance(row, InputError):
        return BadRow(id=f"line:{line}", line=line, key=f"line:{line}", input_hash=content_hash(str(row)), error=row)
    return replace(_checked_row(line, row, first_seen, where, fields, allow_long_summary), columns=row)


def _checked_row(line: int, row: dict, first_seen: dict, where: str, fields: tuple[str, str, str], allow_long_summary):
    source_field, summary_field, id_field = fields
    value = row.get(id_field)
    given = value not in (None, "")
    typed = json.dumps(value, sort_keys=True, ensure_ascii=False) if given else None
    row_id = (value if isinstance(value, str) else typed) if given else None  # as messages show it
    key = (f"id:{value}" if isinstance(value, str) else f"id#json:{typed}") if given else f"line:{line}"
    digest = judged_hash(row.get(source_field), row.get(summary_field), row.get("questions"), row.get("key_facts"))
    name = row_id if given else f"line:{line}"
    if given and not isinstance(value, (str, int, float, bool)):
        error = InputError(
            "must be a string, a number or a boolean; got " + ("an object" if isinstance(value, dict) else "a list"),
            field=id_field,
            line=line,
            path=where,
            cause="bad_id",
        )
        return BadRow(id=name, line=line, key=f"line:{line}", input_hash=digest, error=error)
    if given and typed in first_seen:
        error = InputError(
            f"repeats the id of line {first_seen[typed]}; ids must be unique, so that results and resumed runs "
            f"can be matched to rows",
            field=id_field,
            line=line,
            row_id=row_id,
            path=where,
            cause="duplicate_id",
        )
        return BadRow(id=name, line=line, key=f"line:{line}", input_hash=digest, given_id=value, error=error)
    if given:
        first_seen[typed] = line
    try:
        sample = _sample(row, line, row_id, key, digest, where, source_field, summary_field, allow_long_summary)
    except InputError as exc:
        return BadRow(id=name, line=line, key=key, input_hash=digest, given_id=value if given else None, error=exc)
    return replace(sample, id=name, given_id=value if given else None)


def _sample(
    row: dict,
    line: int,
    row_id: str,
    key: str,
    digest: str,
    where: str,
    source_field: str,
    summary_field: str,
    allow_long_summary: bool,
) -> Sample:
    for field, flag in ((source_field, "--source-field"), (summary_field, "--summary-field")):
        if field not in row:
            raise InputError(
                f"is missing; this row has {', '.join(map(str, row)) or 'no fields'}: "
                + missing_hint(field, flag, [str(k) for k in row], [source_field, summary_field]),
                field=field,
                line=line,
                row_id=row_id,
                path=where,
                cause="missing_field",
            )
    checked = checked_sample(
        row_id,
        row[source_field],
        row[summary_field],
        source_field=source_field,
        summary_field=summary_field,
        line=line,
        path=where,
    )
    source, summary = checked.source, checked.summary
    # Whitespace is no sign of swapped columns: an empty summary of a short source is scored (0), not refused.
    if len(summary) > len(source) and not is_empty_summary(summary) and not allow_long_summary:
        raise InputError(
            f"({len(summary)} characters) is longer than {source_field} ({len(source)} characters): "
            f"are the columns swapped? Pass --allow-long-summary to score such rows",
            field=summary_field,
            line=line,
            row_id=row_id,
            path=where,
            cause="summary_longer_than_source",
        )
    lists = {}
    for field in ("questions", "key_facts"):
        value = row.get(field)
        if value is not None and not (isinstance(value, list) and all(isinstance(q, str) for q in value)):
            raise InputError(
                "must be a list of strings", field=field, line=line, row_id=row_id, path=where, cause=f"bad_{field}"
            )
        lists[field] = tuple(value) if value else None
    if lists["questions"] and lists["key_facts"]:
        raise InputError(
            "gives both questions and key_facts; give one",
            field="key_facts",
            line=line,
            row_id=row_id,
            path=where,
            cause="bad_key_facts",
        )
    doc_id = row.get("doc_id")
    return replace(
        checked, line=line, key=key, input_hash=digest, **lists, doc_id=None if doc_id is None else str(doc_id)
    )


SHARD_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def _shard_rows(folder: Path, **options) -> Iterator[Sample | BadRow]:
    """A folder of shards (JSONL, CSV or Parquet files), in name order, as one input. A row without an id is keyed
    by its shard and line; an id repeated in a later shard is a bad row, as within one file."""
    shards = sorted(p for p in folder.iterdir() if p.suffix.lower() in SHARD_SUFFIXES)
    if not shards:
        raise InputError(
            f"is a directory with no {', '.join(SHARD_SUFFIXES)} shards and no datasets state.json",
            path=str(folder),
            cause="bad_file",
        )
    first_seen: dict[str, str] = {}
    for shard in shards:
        for item in read_rows(shard, **options):
            named = item.key.startswith(("id:", "id#json:"))
            key = item.key if named else f"line:{shard.name}:{item.line}"
            if named and isinstance(item, Sample):
                if item.key in first_seen:  # the key tells 1 from "1", as within one file
                    yield BadRow(
                        id=item.id,
                        line=item.line,
                        key=f"line:{shard.name}:{item.line}",
                        input_hash=item.input_hash,
                        given_id=item.given_id,
                        error=InputError(
                            f"repeats the id of a row in {first_seen[item.key]}; ids must be unique",
                            field=options.get("id_field", "id"),
                            line=item.line,
                            row_id=item.id,
                            path=str(shard),
                            cause="duplicate_id",
                        ),
                        columns=item.columns,
                    )
                    continue
                first_seen[item.key] = shard.name
            yield replace(item, key=key)


def read_samples(path: str | Path, **options) -> Iterator[Sample]:
    """The rows of a file as Samples; raises InputError at the first bad row (for small, trusted inputs)."""
    for item in read_rows(path, **options):
        if isinstance(item, BadRow):
            raise item.error
        yield item


TEXT_KINDS = (".jsonl", ".json", ".ndjson", ".csv", ".tsv")
CSV_DELIMITERS = (",", ";", "\t", "|")


def input_kind(path: Path) -> str:
    """What INPUT is, by its name: a text kind (optionally gzipped), or ".parquet" for Parquet files and save_to_disk
    directories. Any other name is an InputError that says what is read."""
    if path.is_dir():
        return ".parquet"
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    gzipped = suffixes[-1:] == [".gz"]
    inner = (suffixes[-2] if len(suffixes) == 2 else "") if gzipped else (suffixes[-1] if suffixes else "")
    if inner in TEXT_KINDS or (inner == ".parquet" and not gzipped):
        return inner
    raise InputError(
        f"has a name ({path.name}) that says no format this reads: INPUT is JSONL (.jsonl, .ndjson), "
        f"a JSON array or JSONL (.json), CSV (.csv), TSV (.tsv), any of these gzipped (.gz), Parquet "
        f"(.parquet), or a datasets save_to_disk directory",
        path=str(path),
        cause="unknown_format",
    )


def _text_lines(path: Path) -> Iterator[str]:
    """The file's lines, gunzipped when it ends in .gz, decoded as UTF-8 with surrogateescape (so one undecodable
    byte fails its row, where check_text names the field, not the whole file), a byte-order mark dropped."""
    import gzip

    opener = gzip.open if path.suffix.lower() == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="surrogateescape", newline="") as fh:
            first = True
            for text in fh:
                if first:
                    text, first = text.removeprefix("\ufeff"), False
                yield text
    except (OSError, EOFError) as exc:  # a corrupt or truncated gzip stream
        raise InputError(f"cannot be read: {exc}", path=str(path), cause="bad_file") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict | InputError]]:
    lines = _text_lines(path)
    head = next(lines, "")
    if head.lstrip().startswith("["):  # a JSON array (one line or pretty-printed): its elements are the rows
        yield from _array_rows(path, head + "".join(lines))
        return
    for line, text in enumerate(itertools.chain([head], lines), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            cause = "invalid_utf8" if UNDECODABLE.search(text) else "invalid_json"
            yield (
                line,
                InputError(
                    f"is not valid JSON ({exc.msg}: column {exc.colno})", line=line, path=str(path), cause=cause
                ),
            )
            continue
        if not isinstance(row, dict):
            yield (
                line,
                InputError(
                    f"must be a JSON object; got {type(row).__name__}", line=line, path=str(path), cause="invalid_json"
                ),
            )
            continue
        yield line, row


def _array_rows(path: Path, text: str) -> Iterator[tuple[int, dict | InputError]]:
    """The elements of a JSON array, numbered from 1 (an element that is not an object fails alone)."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"starts as a JSON array but is not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno})",
            path=str(path),
            cause="invalid_json",
        ) from None
    if not isinstance(items, list):
        raise InputError("is not a JSON array of objects", path=str(path), cause="invalid_json")
    for n, row in enumerate(items, 1):
        if isinstance(row, dict):
            yield n, row
        else:
            yield (
                n,
                InputError(
                    f"(element {n} of the JSON array) must be a JSON object; got {type(row).__name__}",
                    line=n,
                    path=str(path),
                    cause="invalid_json",
                ),
            )


def _csv_rows(path: Path, needed: Mapping[str, str]) -> Iterator[tuple[int, dict | InputError]]:
    lines = _text_lines(path)
    first = next(lines, "")
    # The delimiter: a tab for .tsv; for .csv the one of , ; tab | whose split of the header holds the needed
    # columns (a spreadsheet in a comma-decimal locale writes semicolons).
    candidates = ("\t",) if ".tsv" in [s.lower() for s in path.suffixes] else CSV_DELIMITERS
    split = {d: next(csv.reader([first], delimiter=d), []) for d in candidates}
    delimiter = next((d for d in candidates if all(f in split[d] for f in needed)), candidates[0])
    reader = csv.DictReader(itertools.chain([first], lines), delimiter=delimiter)
    header = reader.fieldnames or []
    missing = [f for f in needed if f not in header]
    if missing:
        named = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "pipes"}
        seen = "; ".join(f"split by {named[d]}: {', '.join(split[d])}" for d in candidates if len(split[d]) > 1)
        best = max(candidates, key=lambda d: len(split[d]))
        hints = "; ".join(f"for {f}, " + missing_hint(f, needed[f], split[best], list(needed)) for f in missing)
        raise InputError(
            f"CSV header lacks column(s) {', '.join(missing)}; it has {first.strip()!r}"
            + (f" ({seen})" if seen else " (one column, whatever the delimiter)")
            + f": {hints}",
            line=1,
            path=str(path),
            cause="csv_columns",
        )
    start = reader.line_num + 1
    for row in reader:
        line, start = start, reader.line_num + 1  # a quoted field may span lines: report where the row starts
        extra, short = row.get(None), [k for k, v in row.items() if v is None]
        if extra or short:
            count = len(header) + len(extra or []) - len(short)
            yield (
                line,
                InputError(
                    f"has {count} fields; the header has {len(header)}", line=line, path=str(path), cause="csv_columns"
                ),
            )
            continue
        yield line, row
