"""Files in, files out: score an INPUT file (or folder of shards) into OUTPUT, and compare OUTPUTs.

`sumscore score` and `sumscore compare` are these functions behind flags; Python callers call the same ones:

    from offline_sumscore.runs.files import score_file
    run = score_file("in.parquet", "out.csv", SummarizationScorer(judge), resume=True)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offline_sumscore.analysis.comparison import System, compare_systems, split_by_system, system_from_rows
from offline_sumscore.core.durable import replace_bytes
from offline_sumscore.core.errors import InputError, UsageError, WriteError, check_count
from offline_sumscore.core.run_lock import run_lock
from offline_sumscore.core.samples import BadRow
from offline_sumscore.engine.build import EngineSpec, resolve, with_settings
from offline_sumscore.io.inputs import read_rows
from offline_sumscore.io.outputs import need_writer, output_kind, read_results, write_rows
from offline_sumscore.peers.mastra import to_mastra
from offline_sumscore.runs.bulk import DEFAULT_CHUNK_SIZE, BulkReport, run_bulk
from offline_sumscore.runs.ray_pool import RayPool
from offline_sumscore.runs.record import dumps
from offline_sumscore.scorers import METRICS

DEFAULT_SHARD_ROWS = 100_000
RESULT_SUFFIXES = (".jsonl", ".parquet", ".csv")


@dataclass(frozen=True)
class Output:
    """Where a run writes. Rows are appended to a JSONL record as they finish (what --resume reads); the record is
    OUTPUT itself for native JSONL, and other formats, the Mastra shape and folders of shards are written from it at
    the end, when the record, a working file, is removed (a run cut short keeps it, for --resume)."""

    path: str
    sharded: bool  # OUTPUT is a folder (its name ends in /): shards part-00000.<format>, ...
    record: str

    @property
    def lock(self) -> str:
        """The file whose lock says a run holds this OUTPUT (core.run_lock)."""
        return str(Path(self.path) / "run.lock") if self.sharded else f"{self.path}.lock"

    @classmethod
    def at(cls, output_path: str | os.PathLike, output_format: str = "native") -> Output:
        """OUTPUT named: a folder of shards where the name ends in a slash; a file otherwise. A name without one
        that is an existing folder is refused: writing shards into it unasked surprised the user who meant a file."""
        path = str(output_path)
        sharded = path.endswith(("/", os.sep))
        if not sharded and Path(path).is_dir():
            raise UsageError(
                f"OUTPUT {path} is an existing folder: end it with a slash ({path}/) to write shards of rows into it, "
                f"or name a file ({Path(path) / 'scores.jsonl'})"
            )
        if sharded:
            return cls(path, True, str(Path(path) / "rows.jsonl.record"))
        native_jsonl = output_kind(path) == ".jsonl" and output_format == "native"
        return cls(path, False, path if native_jsonl else f"{path}.rows.jsonl")


@dataclass
class FileRun:
    report: BulkReport  # the rows, in input order, and what the run kept, cut and failed
    scorer: Any  # the scorer the rows went through (its stacked engine counts the stage cache's hits)
    output: Output
    bad_rows: int  # input rows that failed their checks and never reached the judge
    seconds: float  # the scoring itself, from the first row sent to OUTPUT written


def refuse_overwriting_input(input_path: str | os.PathLike, targets: Sequence[str]) -> None:
    """OUTPUT (its record, its shard folder) may not be INPUT, through any path or link, nor hold it or lie in it."""
    source = Path(input_path).resolve()
    for target in targets:
        out = Path(target).resolve()
        same = out == source or (out.exists() and source.exists() and os.path.samefile(out, source))
        if same or out.is_relative_to(source) or source.is_relative_to(out):
            raise UsageError(
                f"OUTPUT {target} is INPUT {input_path}, or holds it, or lies in it: scoring into it "
                f"would destroy the input; choose another -o"
            )


def score_file(
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    scorer: Any = None,
    *,
    metric: str = "two-axis",
    model: Any = None,
    options: dict | None = None,
    cache: Any = None,
    engine: Any = None,
    output_format: str = "native",
    shard_rows: int = DEFAULT_SHARD_ROWS,
    shard_format: str = "jsonl",
    resume: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    in_flight: int | None = None,
    fail_fast: bool = False,
    allow_long_summary: bool = False,
    source_field: str = "source",
    summary_field: str = "summary",
    id_field: str = "id",
    progress: Callable[[int], AbstractContextManager[Any]] | None = None,
    notify: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    announce: str | None = None,
) -> FileRun:
    """Score every row of INPUT (JSONL, CSV, Parquet, a datasets save_to_disk directory or a folder of shards) into
    OUTPUT (.jsonl, .parquet, .csv, or a folder ending in / of shards), as `sumscore score` does: bad rows fail alone,
    finished rows are never lost, and resume=True finishes an interrupted run.

    scorer: a SummarizationScorer or SummaryScore; else one is built from metric, model, options (its keyword
    arguments), cache and engine: an EngineSpec (None: auto) or an engine already made. A spec's auto is resolved as
    the CLI's is (engine/build.resolve); a spec of kind ray scores on a pool of Ray actors, each building its own
    scorer. progress(total) gives a context manager whose value has update(n), told of every finished row;
    notify(message) hears of sources judged in pieces and, on a resumed run, of the rows OUTPUT kept and those left
    to score; warn(message) of every input row skipped as bad. announce: told through notify once the judge is
    loaded, before any row is scored (default: the engine the spec resolved to, and why). Raises InputError (cause
    "no_rows") when INPUT holds no rows: OUTPUT is not written."""
    for name, value in (("chunk_size", chunk_size), ("in_flight", in_flight), ("shard_rows", shard_rows)):
        if value is not None:
            check_count(name, value)  # before the judge loads: a typo costs no model load
    if output_format not in ("native", "mastra"):
        raise UsageError(f"output_format must be native or mastra. Given: {output_format}")
    output = _checked_output(input_path, output_path, output_format, shard_format)
    options = dict(options or {})
    engine, chosen = _engine_choice(scorer, engine, model, options)
    announce = announce or (chosen and f"engine: {chosen}")
    scorer = _scorer(scorer, metric, options, cache, engine)
    if output_format == "mastra" and scorer.metric != "two-axis":
        raise UsageError("--output-format mastra is the two-axis metric's shape")
    items = _rows(input_path, source_field, summary_field, id_field, allow_long_summary)
    # OUTPUT's folder is made now, before the judge loads: a typo in a path costs no model load.
    (Path(output.path) if output.sharded else Path(output.path).parent).mkdir(parents=True, exist_ok=True)
    bad = _bad_rows(items, scorer, fail_fast, notify, warn)
    with run_lock(output.lock, output.path):  # one run per OUTPUT, refused before the judge loads
        score_chunks = _on_ray(engine, metric, options, cache)
        if score_chunks is None and len(bad) < len(items):
            scorer.load()  # now: a bad --model fails before OUTPUT is touched
            if announce and notify:
                notify(announce)
        _record_from_output(output, output_format, resume)
        started = time.perf_counter()
        with progress(len(items)) if progress else nullcontext() as bar:
            report = run_bulk(
                items,
                scorer,
                output.record,
                resume=resume,
                chunk_size=chunk_size,
                in_flight=in_flight,
                fail_fast=fail_fast,
                progress=bar.update if bar is not None else None,
                score_chunks=score_chunks,
                notify=notify,  # a resumed run says what it kept and what is left
            )
        _write_final(output, report, output_format, shard_rows, shard_format)
    return FileRun(
        report=report, scorer=scorer, output=output, bad_rows=len(bad), seconds=time.perf_counter() - started
    )


def _checked_output(input_path, output_path, output_format: str, shard_format: str) -> Output:
    """OUTPUT, refused before the engine is chosen (which imports torch: seconds) and long before the judge loads
    where its format's library is missing or it would overwrite INPUT."""
    output = Output.at(output_path, output_format)
    need_writer(output.path, "." + shard_format if output.sharded else None)
    refuse_overwriting_input(input_path, [output.path, output.record])
    return output


def _bad_rows(items: list, scorer, fail_fast: bool, notify, warn) -> list[BadRow]:
    """The input rows that failed their checks: the first raised with fail_fast, else each one warned of."""
    bad = [item for item in items if isinstance(item, BadRow)]
    if fail_fast and bad:
        raise bad[0].error
    if notify:
        scorer.notify = notify
    for item in bad if warn else ():
        warn(f"skipping: {item.error}")
    return bad


def _engine_choice(scorer, engine, model, options: dict) -> tuple[Any, str | None]:
    """(the engine or the resolved EngineSpec the scorer is built on, the line that says which engine and why).
    A scorer given brings its own engine; an engine given is used as it is. The engine's settings among options
    (device, dtype, batch_size, token_budget) move into the spec, so that auto is resolved with them."""
    if scorer is not None:
        if engine is not None or model is not None:
            raise UsageError(
                "give score_file either a scorer, or metric, model, options and engine to build one (a Ray pool "
                "builds one per actor from them), not both"
            )
        return None, None
    if engine is not None and not isinstance(engine, EngineSpec):
        if model is not None:
            raise UsageError("give score_file a model or an engine already made on one, not both")
        return engine, None
    settings = {k: options.pop(k) for k in ENGINE_SETTINGS if k in options}
    return resolve(with_settings(engine, model=model, **settings))


ENGINE_SETTINGS = ("device", "dtype", "batch_size", "token_budget", "device_share")


def _scorer(scorer, metric: str, options: dict, cache, engine):
    """The scorer given, or one built from metric, options, cache and engine; refuses a mix of both."""
    if scorer is not None and options:
        raise UsageError(
            "give score_file either a scorer, or metric, model and options to build one (a Ray pool "
            "builds one per actor from them), not both"
        )
    return scorer if scorer is not None else METRICS[metric](cache=cache, engine=engine, **options)


def _on_ray(engine, metric: str, options: dict, cache):
    """Where the spec is of kind ray: the chunk scorer of its pool of actors, each building a scorer on our engine
    with the spec's settings (those that are not the defaults); else None."""
    if not (isinstance(engine, EngineSpec) and engine.kind == "ray"):
        return None
    pool = RayPool(
        num_judges=engine.num_judges,
        address=engine.ray_address,
        gpus_per_judge=engine.gpus_per_judge,
        cpus_per_judge=engine.cpus_per_judge,
    )
    fields = {"device": engine.device, "dtype": engine.dtype}
    fields.update(batch_size=engine.batch_size, token_budget=engine.token_budget)
    settings = {k: v for k, v in fields.items() if v not in (None, "auto")}
    return pool.chunk_scorer(metric, engine.model, {**options, **settings}, cache)


def _rows(input_path, source_field: str, summary_field: str, id_field: str, allow_long_summary: bool) -> list:
    """INPUT's rows, each a Sample or a BadRow; InputError (cause "no_rows") when it holds none."""
    items = list(
        read_rows(
            input_path,
            source_field=source_field,
            summary_field=summary_field,
            id_field=id_field,
            allow_long_summary=allow_long_summary,
        )
    )
    if not items:
        raise InputError(
            "holds no rows (an empty file, or only blank lines): nothing to score, OUTPUT not written",
            path=str(input_path),
            cause="no_rows",
        )
    return items


def _final_files(output: Output) -> list[Path]:
    """OUTPUT's final files, where a finished run wrote them (none before one has)."""
    path = Path(output.path)
    if output.sharded:
        return sorted(f for f in path.iterdir() if f.suffix in RESULT_SUFFIXES) if path.is_dir() else []
    return [path] if path.is_file() else []


def _record_from_output(output: Output, output_format: str, resume: bool) -> None:
    """--resume after a finished run, whose record was removed: the record again, from OUTPUT's rows (CSV's text
    read back as the numbers and booleans it was written from)."""
    record, finals = Path(output.record), _final_files(output) if resume else []
    if output.record == output.path or record.exists() or not finals:
        return
    if output_format == "mastra":
        raise UsageError(
            f"{output.path} holds rows in Mastra's shape, which lack what --resume matches rows by; "
            f"drop --resume to score every row again"
        )
    rows = [_typed(row) if f.suffix == ".csv" else row for f in finals for row in read_results(f)]
    try:
        replace_bytes(record, b"".join(dumps(r) for r in rows))
    except OSError as exc:
        raise WriteError(record, exc, f"{output.path} is as it was; free space and run again") from None


def _typed(row: dict) -> dict:
    """A CSV row read back: our scalar fields as the numbers, booleans and nulls they were (the id and the input's
    own fields stay as the file has them)."""
    out = dict(row)
    for key, value in row.items():
        if key in ("id", "input", "row_key", "input_hash", "source_hash") or not isinstance(value, str):
            continue
        if value in ("", "True", "False"):
            out[key] = {"": None, "True": True, "False": False}[value]
            continue
        try:
            out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            pass
    return out


def _write_final(output: Output, report: BulkReport, output_format: str, shard_rows: int, shard_format: str) -> None:
    """OUTPUT in its final form, where that is not the run's own record (another format, a folder of shards); then
    the record, a working file, is removed, unless the run stopped short (--fail-fast), which --resume finishes.
    Shards are written one at a time, and report.rows reads them back one at a time after; a single CSV or Parquet
    file is written as one table, so its rows are held together at the end (the run's own JSONL never is)."""
    if output.record == output.path:
        return
    shape = to_mastra if output_format == "mastra" else (lambda row: row)
    target = Path(output.path)
    try:
        if output.sharded:
            shards = []
            for n, start in enumerate(range(0, len(report.rows), shard_rows)):
                target = Path(output.path) / f"part-{n:05d}.{shard_format}"
                write_rows([shape(r) for r in report.rows[start : start + shard_rows]], target)
                shards.append(target)
            kept = ShardRows(shards, len(report.rows)) if output_format == "native" else list(report.rows)
        else:
            kept = list(report.rows)
            write_rows([shape(r) for r in kept], output.path)
    except OSError as exc:
        raise WriteError(
            target,
            exc,
            f"every row is kept in {output.record}; rerun the same command with --resume once the cause is gone",
        ) from None
    if not report.stopped_early:
        report.rows = kept  # no longer read from the record, which goes
        Path(output.record).unlink(missing_ok=True)


class ShardRows(Sequence):
    """A sharded OUTPUT's rows, read back a shard at a time as they are iterated."""

    def __init__(self, shards: list[Path], count: int):
        self.shards, self.count = shards, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for shard in self.shards:
            yield from read_results(shard)

    def __getitem__(self, at):
        return list(self)[at]  # whole shards are read: iterate where you can


def compare_files(
    paths: Sequence[str | os.PathLike],
    *,
    names: Sequence[str] | None = None,
    by: str | None = None,
    system_field: str | None = None,
    id_field: str | None = None,
    allow_mixed: bool = False,
    resamples: int = 10000,
    seed: int = 0,
) -> tuple[dict, list[System]]:
    """`sumscore compare`: (report, systems) from two or more OUTPUTs (files, or folders of shards), one per system;
    or, with system_field, from the rows of one or more OUTPUTs, each row's system named by that field (the input
    row's `model`, say). by: the field that names each row's document (default: the source's hash); id_field: the
    field that names a row in what is reported (default: its id, else its line)."""
    read = [(Path(path), _result_rows(Path(path))) for path in paths]
    if system_field:
        if names:
            raise UsageError("--name names one file per system; with --system-field the systems are named by it")
        groups = split_by_system([row for _, rows in read for row in rows], system_field)
        systems = [system_from_rows(name, rows, by, id_field) for name, rows in groups.items()]
    else:
        systems = [
            system_from_rows(names[k] if names else path.name.split(".")[0] or str(path), rows, by, id_field)
            for k, (path, rows) in enumerate(read)
        ]
    if len({s.name for s in systems}) < len(systems):
        raise UsageError(
            "two RESULTS have the same name (" + ", ".join(s.name for s in systems) + "): tell them apart with --name"
        )
    return compare_systems(systems, allow_mixed=allow_mixed, resamples=resamples, seed=seed), systems


def _result_rows(path: Path) -> list[dict]:
    """The rows of one OUTPUT: a file, or a folder of shards."""
    files = sorted(f for f in path.iterdir() if f.suffix in RESULT_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise InputError(
            f"is a folder with no {', '.join(RESULT_SUFFIXES)} shards", path=str(path), cause="not_results"
        )
    return [row for f in files for row in read_results(f)]
