"""Data formats beyond JSONL and CSV: Parquet files, Hugging Face `datasets` directories (save_to_disk), pandas
DataFrames; and writing results as JSONL, Parquet or CSV by the output's extension.

Input rows from every format pass the same checks as JSONL rows (samples.read_rows): a bad row fails alone.
Output: verdict lists (claims, questions, coverage_verdicts, keyphrases, answers) stay nested in JSONL and Parquet
and become JSON strings in CSV; the audit fields whose keys differ from row to row (stages, judge, settings,
error) are JSON strings in Parquet and CSV, nested in JSONL.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Iterator

from .durable import replace_bytes, replace_file, replace_text
from .errors import InputError, UsageError

AUDIT_FIELDS = ("stages", "judge", "settings", "error")
OUTPUT_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def _need(module: str, extra: str = "formats"):
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
        pq = _need("pyarrow.parquet")
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise InputError(f"is not a readable Parquet file ({exc})", path=str(path), cause="bad_file") from None
    elif is_hf_dataset_dir(path):
        table = _read_hf_dir(path)
    else:
        raise InputError("is a directory but not a Hugging Face datasets save_to_disk directory (no state.json "
                         "and dataset_info.json)", path=str(path), cause="bad_file")
    for n, row in enumerate(table.to_pylist(), 1):
        yield n, row


def _read_hf_dir(path: Path):
    """The Arrow files a save_to_disk directory lists in state.json, concatenated in order. Reads with pyarrow
    alone, so the `datasets` package is not needed to score its output."""
    pa = _need("pyarrow")
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
def output_kind(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise UsageError(f"OUTPUT must end in {', '.join(OUTPUT_SUFFIXES)}; given {Path(path).name}")
    return {".json": ".jsonl"}.get(suffix, suffix)


def flat_row(row: dict, *, lists_as_json: bool) -> dict:
    out = {}
    for key, value in row.items():
        if key in AUDIT_FIELDS or (lists_as_json and isinstance(value, (list, dict))):
            out[key] = None if value is None else json.dumps(value, ensure_ascii=False)
        else:
            out[key] = value
    return out


def write_rows(rows: list[dict], path: str | os.PathLike) -> None:
    """Write rows atomically in the format the path's extension names."""
    path = Path(path)
    kind = output_kind(path)
    if kind == ".jsonl":
        replace_bytes(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
                      .encode("utf-8", "surrogatepass"))
    elif kind == ".csv":
        flat = [flat_row(r, lists_as_json=True) for r in rows]
        columns = list(dict.fromkeys(k for r in flat for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
        replace_text(path, buf.getvalue())
    else:
        pa, pq = _need("pyarrow"), _need("pyarrow.parquet")
        flat = [flat_row(r, lists_as_json=False) for r in rows]
        columns = list(dict.fromkeys(k for r in flat for k in r))
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in flat])
        replace_file(path, lambda tmp: pq.write_table(table, tmp))


def read_results(path: str | os.PathLike) -> list[dict]:
    """Rows written by write_rows (any of the three formats), with JSON-string fields decoded again. A file with
    no rows, or whose rows are not results (no metric and score: an INPUT, say), is an InputError."""
    rows = _read_results(Path(path))
    if not rows:
        raise InputError("holds no rows: it is not a `sumscore score` OUTPUT file", path=str(path),
                         cause="not_results")
    if not any("score" in r for r in rows):
        raise InputError(f"is not a `sumscore score` OUTPUT file: its rows have no score (fields: "
                         f"{', '.join(list(rows[0])[:6])}); give the OUTPUT of a run, not its INPUT",
                         path=str(path), cause="not_results")
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
                    raise InputError(f"is not valid JSON ({exc.msg}); is this a `sumscore score` OUTPUT file?",
                                     line=n, path=str(path)) from None
        return rows
    if kind == ".csv":
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    else:
        rows = _need("pyarrow.parquet").read_table(path).to_pylist()
    out = []
    for row in rows:
        fixed = {}
        for key, value in row.items():
            if isinstance(value, str) and (key in AUDIT_FIELDS or (kind == ".csv" and value[:1] in "[{")):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            fixed[key] = value
        out.append(fixed)
    return out


# -- pandas ---------------------------------------------------------------------------------------------------------
def score_frame(df, *, source: str = "source", summary: str = "summary", id: str | None = None, scorer: Any = None,
                metric: str = "two-axis", **options):
    """df with one result column per result field added (score, reason, alignment, ..., error), in df's order.

    source/summary/id name df's columns. scorer: a SummarizationScorer or SummaryScore (else one is made for
    `metric` with **options). A row that cannot be scored gets score None and its error, as in a bulk run."""
    from .samples import checked_sample, input_error
    from .scorers import METRICS

    for column in (source, summary) + ((id,) if id else ()):
        if column not in df.columns:
            raise UsageError(f"the DataFrame has no column {column!r}; it has {', '.join(map(str, df.columns))}")
    if scorer is None:
        scorer = METRICS[metric](**options)
    samples, errors = [], {}
    for n, (index, row) in enumerate(df.iterrows()):
        row_id = str(row[id]) if id else str(index)
        try:
            samples.append(checked_sample(row_id, row[source], row[summary], source_field=source,
                                          summary_field=summary, line=n + 1))
        except InputError as exc:
            errors[n] = input_error(exc)
    results = iter(scorer.score_many(samples, on_error="return"))
    records = []
    for n in range(len(df)):
        if n in errors:
            records.append({"score": None, "error": errors[n]})
        else:
            record = next(results).to_dict()
            record.pop("id", None)
            records.append(record)
    out = df.copy()
    columns = list(dict.fromkeys(k for r in records for k in r))
    for column in columns:
        out[column if column not in df.columns else f"result_{column}"] = [r.get(column) for r in records]
    return out
