"""OUTPUT files: result rows written as JSONL, Parquet or CSV by the output's extension, and read back.

Verdict lists (claims, questions, coverage_verdicts, keyphrases, answers) stay nested in JSONL and Parquet
and become JSON strings in CSV; the audit fields whose keys differ from row to row (stages, judge, settings,
error) are JSON strings in Parquet and CSV, nested in JSONL. The input row's own fields (the user's doc, model, ...)
are one object, "input", in JSONL, and columns of their own, "input.<name>", in Parquet and CSV, first after the id:
apart from ours, so that no name of theirs can overwrite a score.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from offline_sumscore.core.durable import replace_bytes, replace_file, replace_text
from offline_sumscore.core.errors import InputError, UsageError
from offline_sumscore.io.inputs import need_module

AUDIT_FIELDS = ("stages", "judge", "settings", "error")
OUTPUT_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def output_kind(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise UsageError(f"OUTPUT must end in {', '.join(OUTPUT_SUFFIXES)}; given {Path(path).name}")
    return {".json": ".jsonl"}.get(suffix, suffix)


# The libraries each OUTPUT format needs beyond Python's own (JSONL and CSV need none).
WRITER_MODULES = {".parquet": ("pyarrow", "pyarrow.parquet")}


def need_writer(path: str | os.PathLike, kind: str | None = None) -> None:
    """OUTPUT's format (kind, else path's extension) can be written here, or a UsageError naming the library missing
    and how to install it. A run checks this before its judge loads: a Parquet OUTPUT without pyarrow used to be
    refused once the judge had loaded and every row was scored."""
    for module in WRITER_MODULES.get(kind or output_kind(path), ()):
        try:
            need_module(module)
        except UsageError as exc:
            raise UsageError(f"OUTPUT {path}: {exc}; or write JSONL or CSV") from None


INPUT_PREFIX = "input."


def flat_row(row: dict, *, lists_as_json: bool) -> dict:
    out = {}
    for key, value in row.items():
        if key == "input" and isinstance(value, dict):
            for name, given in value.items():
                nested = isinstance(given, (list, dict)) and (lists_as_json or isinstance(given, dict))
                out[INPUT_PREFIX + str(name)] = json.dumps(given, ensure_ascii=False, default=str) if nested else given
        elif key in AUDIT_FIELDS or (lists_as_json and isinstance(value, (list, dict))):
            out[key] = None if value is None else json.dumps(value, ensure_ascii=False)
        else:
            out[key] = value
    return out


def write_rows(rows: list[dict], path: str | os.PathLike) -> None:
    """Write rows atomically in the format the path's extension names."""
    path = Path(path)
    kind = output_kind(path)
    if kind == ".jsonl":
        replace_bytes(
            path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8", "surrogatepass")
        )
    elif kind == ".csv":
        flat = [flat_row(r, lists_as_json=True) for r in rows]
        columns = _columns(flat)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
        replace_text(path, buf.getvalue())
    else:
        pa, pq = need_module("pyarrow"), need_module("pyarrow.parquet")
        flat = [flat_row(r, lists_as_json=False) for r in rows]
        columns = _columns(flat)
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in flat])
        replace_file(path, lambda tmp: pq.write_table(table, tmp))


def _columns(flat: list[dict]) -> list[str]:
    """Every flat row's columns: the id, then the input's own fields, then ours, each in first-seen order."""
    columns = list(dict.fromkeys(k for r in flat for k in r))
    theirs = [c for c in columns if c.startswith(INPUT_PREFIX)]
    return [c for c in columns if c == "id"] + theirs + [c for c in columns if c != "id" and c not in theirs]


def read_results(path: str | os.PathLike) -> list[dict]:
    """Rows written by write_rows (any of the three formats), with JSON-string fields decoded again. A file with
    no rows, or whose rows are not results (no metric and score: an INPUT, say), is an InputError."""
    rows = _read_results(Path(path))
    if not rows:
        raise InputError("holds no rows: it is not a `sumscore score` OUTPUT file", path=str(path), cause="not_results")
    if not any("score" in r for r in rows):
        raise InputError(
            f"is not a `sumscore score` OUTPUT file: its rows have no score (fields: "
            f"{', '.join(list(rows[0])[:6])}); give the OUTPUT of a run, not its INPUT",
            path=str(path),
            cause="not_results",
        )
    return rows


def _read_results(path: Path) -> list[dict]:
    kind = output_kind(path)
    if kind == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InputError(
                        f"is not valid JSON ({exc.msg}); is this a `sumscore score` OUTPUT file?",
                        line=n,
                        path=str(path),
                    ) from None
        return rows
    if kind == ".csv":
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    else:
        rows = need_module("pyarrow.parquet").read_table(path).to_pylist()
    out = []
    for row in rows:
        fixed, given = {}, {}
        for key, value in row.items():
            if isinstance(value, str) and (key in AUDIT_FIELDS or (kind == ".csv" and value[:1] in "[{")):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            if key.startswith(INPUT_PREFIX):
                given[key[len(INPUT_PREFIX) :]] = value
            else:
                fixed[key] = value
        out.append(dict(fixed, input=given) if given else fixed)
    return out
