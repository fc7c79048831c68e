"""The `sumscore` command line. Flags are kebab-case and map 1:1 to the scorers' keyword arguments; each
default is read from the scorer's signature, so it is defined once.

Exit codes: 0 every row scored; 1 some rows failed (each recorded in OUTPUT with its error); 2 bad usage or
input; 3 INPUT holds no rows; 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), the rows scored so far kept.
Errors are one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import click

from offline_sumscore.core.durable import replace_text
from offline_sumscore.core.errors import InputError, SumscoreError
from offline_sumscore.io.inputs import read_samples
from offline_sumscore.runs.bulk import DEFAULT_CHUNK_SIZE, DEFAULT_IN_FLIGHT
from offline_sumscore.scorers import METRICS, SummarizationScorer, SummaryScore
from offline_sumscore.scorers.base import ScorerBase

EXIT_ROWS_FAILED = 1
EXIT_NO_ROWS = 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + the signal's number, as shells report them


class Terminated(BaseException):
    """SIGTERM, raised where the run can say what it kept (Ctrl-C is Python's KeyboardInterrupt). A BaseException, as
    KeyboardInterrupt is, so that no layer that retries a failed engine call swallows it."""


@contextlib.contextmanager
def _interruptible(record: str):
    """Ctrl-C (130) or SIGTERM (143) during a run: say how many rows OUTPUT kept and how to finish, then exit."""

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except (KeyboardInterrupt, Terminated) as exc:
        from offline_sumscore.runs.bulk import read_finished

        kept = len(read_finished(Path(record))[0]) if Path(record).exists() else 0
        what, code = (
            ("interrupted", EXIT_INTERRUPTED) if isinstance(exc, KeyboardInterrupt) else ("terminated", EXIT_TERMINATED)
        )
        click.echo(f"{what}: {kept} rows kept in {record}; rerun the same command with --resume to finish", err=True)
        sys.exit(code)
    finally:
        signal.signal(signal.SIGTERM, previous)


class InputProblem(click.ClickException):
    """Bad usage or input: one line, exit code 2 (as click's own usage errors), apart from failed rows' 1."""

    exit_code = 2


def _default(cls, name: str) -> Any:
    return inspect.signature(cls.__init__).parameters[name].default


def _scorer_options(metric: str, opts: dict) -> dict:
    """Keep the options the chosen scorer takes; say so loudly when an option belongs to the other metric."""
    cls = METRICS[metric]
    accepted = set(inspect.signature(cls.__init__).parameters) | {"device", "dtype", "batch_size", "token_budget"}
    kwargs = {}
    for key, value in opts.items():
        if value is None:
            continue
        if key not in accepted:
            raise click.UsageError(f"--{key.replace('_', '-')} does not apply to --metric {metric}")
        kwargs[key] = value
    return kwargs


# Parameters whose flag is not their name with dashes: the served judge's keywords are prefixed on the command line.
FLAG_OF = {"concurrency": "--judge-concurrency", "timeout": "--judge-timeout"}


def _flag(parameter: str) -> str:
    """The flag a user typed for a keyword parameter that an error names."""
    return FLAG_OF.get(parameter, "--" + parameter.replace("_", "-"))


def _table(metric: str, rows: list[dict], seconds: float) -> str:
    ok = [r for r in rows if r.get("error") is None]
    cols = ["score", "alignment", "coverage"] if metric == "two-axis" else ["score", "qa", "conciseness"]

    def mean(key):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return f"{sum(vals) / len(vals):.3f}" if vals else "-"

    tokens_in = sum(
        s["tokens_in"] for r in rows for s in r.get("stages", {}).values()
    )  # shared prefixes counted per row
    tokens_out = sum(s["tokens_out"] for r in rows for s in r.get("stages", {}).values())
    lines = [
        f"metric {metric}: {len(rows)} rows, {len(rows) - len(ok)} failed, {seconds:.1f} s, "
        f"{tokens_in} tokens in, {tokens_out} tokens out",
        " | ".join(f"mean {c}" for c in cols),
        " | ".join(mean(c) for c in cols),
    ]
    return "\n".join(lines)


def _p(value: float | None) -> str:
    return "-   " if value is None else f"{value:.2f}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="offline-sumscore")
def main():
    """Score summaries against their sources with a local LLM judge. No network, no hosted API."""


def _common(fn):
    options = [
        click.option(
            "--model",
            type=click.Path(),
            default=None,
            help="Model directory, .gguf file or preset name (`sumscore models`). Default: the embedded "
            "SmolLM2-135M-Instruct.",
        ),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N."),
        click.option(
            "--dtype",
            default="auto",
            show_default=True,
            help="auto (bf16 on a capable GPU, fp32 on CPU), float32, bfloat16 or float16.",
        ),
        click.option(
            "--batch-size",
            type=int,
            default=_default(ScorerBase, "batch_size"),
            help="Most rows in flight per forward pass (a row is one stage request). Default: 64 on CPU, 512 on a GPU.",
        ),
        click.option(
            "--token-budget",
            type=int,
            default=None,
            help="Most tokens held in the KV cache at once. Default: from free memory.",
        ),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True))
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    type=click.Path(),
    help="One row per input row, in input order: .jsonl, .parquet or .csv (by extension), or a folder "
    "(ending in /) of shards.",
)
@click.option(
    "--shard-rows",
    type=int,
    default=100_000,
    show_default=True,
    help="When OUTPUT is a folder (ends with /): rows per shard file.",
)
@click.option(
    "--shard-format",
    type=click.Choice(["jsonl", "parquet", "csv"]),
    default="jsonl",
    show_default=True,
    help="When OUTPUT is a folder: the shards' format (part-00000.jsonl, ...).",
)
@click.option(
    "--output-format",
    type=click.Choice(["native", "mastra"]),
    default="native",
    show_default=True,
    help="mastra: two-axis rows shaped as Mastra's scorer result (score, reason, preprocessStepResult, "
    "analyzeStepResult).",
)
@click.option("--metric", type=click.Choice(list(METRICS)), default="two-axis", show_default=True)
@_common
@click.option(
    "--flavor",
    type=click.Choice(["mastra", "deepeval"]),
    default=None,
    help="two-axis: whose semantics: Mastra's scorer (default) or DeepEval's SummarizationMetric.",
)
@click.option(
    "--claims",
    "claims",
    type=click.Choice(["auto", "atomic", "sentences"]),
    default=None,
    help="two-axis: atomic claims drawn by the judge, or the summary's sentences (default: the judge's).",
)
@click.option(
    "--coverage",
    "coverage",
    type=click.Choice(["auto", "questions", "key_sentences"]),
    default=None,
    help="two-axis: questions drawn from the source, or its lead sentences (default: the judge's).",
)
@click.option(
    "--verdicts",
    type=click.Choice(["auto", "yes-no", "likelihood"]),
    default=None,
    help="two-axis: Yes/No read as P(Yes), or the judge's likelihood of each statement (default: the judge's).",
)
@click.option(
    "--prompt-style",
    type=click.Choice(["auto", "full", "bare"]),
    default=None,
    help="two-axis: a system message with the principles (full) or none of ours (bare) (default: the judge's).",
)
@click.option(
    "--key-sentences",
    type=int,
    default=None,
    help=f"two-axis: lead sentences checked by --coverage key_sentences (default "
    f"{_default(SummarizationScorer, 'key_sentences')}).",
)
@click.option(
    "--likelihood-threshold",
    type=float,
    default=None,
    help=f"two-axis: nats per token for a likelihood 'yes' (default "
    f"{_default(SummarizationScorer, 'likelihood_threshold')}, set on the embedded judge).",
)
@click.option(
    "--max-questions",
    type=int,
    default=None,
    help="Questions drawn and counted (two-axis: 10, exactly 5 with --flavor deepeval; summary-score: a "
    "safety bound of 50).",
)
@click.option(
    "--scale", type=float, default=None, help="two-axis: score = min(alignment, coverage) x scale (default 1)."
)
@click.option("--threshold", type=float, default=None, help="two-axis: pass mark on the 0..1 scale (default 0.5).")
@click.option("--strict-mode", is_flag=True, default=None, help="two-axis: each axis is 0 unless it is 1.")
@click.option(
    "--no-reason",
    "include_reason",
    flag_value=False,
    default=None,
    help="two-axis: no reasons (faster: skips decoding them).",
)
@click.option("--coeff", type=float, default=None, help="summary-score: weight of conciseness, 0..1 (default 0.5).")
@click.option(
    "--no-length-penalty", "length_penalty", flag_value=False, default=None, help="summary-score: score = QA alone."
)
@click.option(
    "--max-claims",
    type=int,
    default=None,
    help=f"two-axis: safety bound on one claims list; a list that reaches it is drawn again from halves of "
    f"the summary, never cut (default {_default(SummarizationScorer, 'max_claims')}).",
)
@click.option(
    "--max-keyphrases",
    type=int,
    default=None,
    help=f"summary-score: safety bound on keyphrases (default {_default(SummaryScore, 'max_keyphrases')}).",
)
@click.option("--max-text-chars", type=int, default=None, help="Cap on each claim/question/keyphrase (default 200).")
@click.option("--max-reason-chars", type=int, default=None, help="two-axis: cap on each reason (default 200).")
@click.option("--source-field", default="source", show_default=True)
@click.option("--summary-field", default="summary", show_default=True)
@click.option("--id-field", default="id", show_default=True)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the rows already in OUTPUT (matched by id, or by line and content) and score the rest.",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Stage cache (SQLite). Default: $OFFLINE_SUMSCORE_CACHE or ~/.cache/offline_sumscore/stages.sqlite.",
)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the stage cache.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first row that cannot be scored (exit 2 for bad input).")
@click.option("--allow-long-summary", is_flag=True, help="Score rows whose summary is longer than their source.")
@click.option(
    "--chunk-size",
    type=int,
    default=DEFAULT_CHUNK_SIZE,
    show_default=True,
    help="Rows written (and checkpointed) together. Resume with the same value.",
)
@click.option(
    "--in-flight",
    type=click.IntRange(1, 4096),
    default=DEFAULT_IN_FLIGHT,
    show_default=True,
    help="Rows scored at once in one stream through the judge (a new one starts as one finishes).",
)
@click.option(
    "--judge-url",
    default=None,
    help="Use a judge served elsewhere on this machine: an OpenAI-compatible base URL, e.g. "
    "http://127.0.0.1:8000/v1 (vLLM, llama.cpp server, Ollama, transformers serve).",
)
@click.option("--judge-model", default=None, help="With --judge-url: the model name the server knows.")
@click.option("--judge-concurrency", type=int, default=4, show_default=True, help="With --judge-url: requests at once.")
@click.option(
    "--judge-timeout", type=float, default=120, show_default=True, help="With --judge-url: seconds a request."
)
@click.option(
    "--engine",
    "engine_kind",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: a pool of Ray actors, one loaded judge each (pip install 'offline-sumscore[ray]').",
)
@click.option(
    "--ray-address",
    default=None,
    help="With --engine ray: auto, ray://HOST:PORT, ... Default: start a local Ray with this machine's GPUs (or CPUs).",
)
@click.option("--num-judges", type=int, default=1, show_default=True, help="With --engine ray: actors (judges).")
@click.option(
    "--gpus-per-judge",
    type=float,
    default=None,
    help="With --engine ray: GPUs per actor (default 1 where Ray sees GPUs, else 0).",
)
@click.option("--cpus-per-judge", type=float, default=1, show_default=True, help="With --engine ray: CPUs per actor.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def score(
    input_path,
    output_path,
    shard_rows,
    shard_format,
    output_format,
    metric,
    source_field,
    summary_field,
    id_field,
    resume,
    cache_path,
    no_cache,
    fail_fast,
    allow_long_summary,
    chunk_size,
    in_flight,
    judge_url,
    judge_model,
    judge_concurrency,
    judge_timeout,
    engine_kind,
    ray_address,
    num_judges,
    gpus_per_judge,
    cpus_per_judge,
    quiet,
    **opts,
):
    """Score every row of INPUT (JSONL, CSV, Parquet or a datasets save_to_disk directory, with source and summary
    fields and an optional id) into OUTPUT.

    Rows are written as they are scored; after a crash, --resume finishes the run. A row that cannot be scored is
    written with an "error" (stage, cause, message) and the run goes on; the exit code is 1 if any row failed.
    """
    from offline_sumscore.engine.stage_cache import StageCache, default_cache_path
    from offline_sumscore.runs.files import Output, score_file
    from offline_sumscore.runs.ray_pool import RayPool

    try:
        cache = None if no_cache else StageCache(cache_path or default_cache_path())
        engine = None
        if judge_url:
            from offline_sumscore.engine.openai_compatible import ServedEngine

            if not judge_model:
                raise click.UsageError("--judge-url needs --judge-model (the name the server serves the model as)")
            engine = ServedEngine(judge_url, judge_model, concurrency=judge_concurrency, timeout=judge_timeout)
        if quiet:  # quiet means quiet: no weight-loading bars either
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        ray = (
            RayPool(
                num_judges=num_judges, address=ray_address, gpus_per_judge=gpus_per_judge, cpus_per_judge=cpus_per_judge
            )
            if engine_kind == "ray"
            else None
        )
        model = opts.pop("model")

        def say(message: str) -> None:
            click.echo(message, err=True)

        with _interruptible(Output.at(output_path, output_format).record):
            run = score_file(
                input_path,
                output_path,
                metric=metric,
                model=model,
                options=_scorer_options(metric, opts),
                cache=cache,
                engine=engine,
                ray=ray,
                output_format=output_format,
                shard_rows=shard_rows,
                shard_format=shard_format,
                resume=resume,
                chunk_size=chunk_size,
                in_flight=in_flight,
                fail_fast=fail_fast,
                allow_long_summary=allow_long_summary,
                source_field=source_field,
                summary_field=summary_field,
                id_field=id_field,
                progress=lambda total: click.progressbar(
                    length=total, label=f"scoring ({metric})", file=sys.stderr, hidden=quiet
                ),
                notify=None if quiet else say,
                warn=say,
            )
    except InputError as exc:
        if exc.cause != "no_rows":
            raise InputProblem(str(exc)) from None
        click.echo(f"warning: {exc}", err=True)
        sys.exit(EXIT_NO_ROWS)
    except SumscoreError as exc:  # a scorer names its parameter (batch_size); here the user typed a flag
        raise InputProblem(re.sub(r"^([a-z_]+) (?=must|should)", lambda m: f"{_flag(m.group(1))} ", str(exc))) from None
    report = run.report
    click.echo(_table(metric, report.rows, run.seconds))
    scored_here = run.bad_rows < len(report.rows) and ray is None
    stacked = run.scorer.stacked_engine if scored_here else None
    if report.resumed:
        click.echo(
            f"{report.resumed} rows kept from OUTPUT"
            + (" (a torn last line was cut and redone)" if report.torn_tail else "")
        )
    if cache is not None and stacked is not None:
        asked = stacked.hits + stacked.computed
        click.echo(
            f"stage cache {cache.path}: {stacked.hits} of {asked} stage requests answered from it "
            f"({100 * stacked.hits / asked if asked else 0:.0f}%), {stacked.computed} sent to the judge"
        )
    failed = [r for r in report.rows if r.get("error")]
    if report.stopped_early:
        click.echo(f"stopped at the first failed row (--fail-fast): {failed[-1]['error']['message']}")
    if failed:
        causes = sorted(report.failed_by_cause.items(), key=lambda kv: (-kv[1], kv[0]))
        click.echo(
            f"failed rows: {len(failed)} of {len(report.rows)} ("
            + ", ".join(f"{cause} {n}" for cause, n in causes)
            + ")"
        )
        sys.exit(EXIT_ROWS_FAILED)


@main.command()
def models():
    """List the judge presets and which are present on this machine. Nothing is downloaded."""
    from offline_sumscore.engine.judge import models_root, presets

    root = models_root()
    click.echo(f"models root: {root} (set OFFLINE_SUMSCORE_MODELS to move it)")
    for name, p in presets().items():
        path = root / p["path"]
        present = "present" if (path / "config.json").exists() else "absent "
        batch = ", ".join(f"{gib} GiB: {rows}" for gib, rows in p.get("batch_size_by_gpu_gib", {}).items())
        click.echo(
            f"{present}  {name:26} {path}\n           context {p['context_length']}, {p['dtype']}; "
            f"--batch-size by GPU memory: {batch}\n           template: {p['chat_template']}\n"
            f"           get it: {p['source']}"
        )


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o", "--output", "output_path", type=click.Path(dir_okay=False), default="report.html", show_default=True
)
@click.option("--title", default=None, help="Page title. Default: the results file's name.")
@click.option("--worst", type=int, default=10, show_default=True, help="How many of the lowest scores to show.")
def report(results, output_path, title, worst):
    """Write one self-contained HTML page (no network: inline CSS and SVG) from a `sumscore score` OUTPUT."""
    from offline_sumscore.io.outputs import read_results
    from offline_sumscore.io.report import render

    try:
        rows = read_results(results)
        page = render(rows, title=title or f"offline_sumscore: {Path(results).name}", worst=worst)
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    replace_text(output_path, page)
    click.echo(f"{output_path}: {len(rows)} rows, {len(page) // 1024} KiB")


@main.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "-o",
    "--output",
    "output_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the comparison as one self-contained HTML page.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the comparison as JSON, for scripts.",
)
@click.option(
    "--by",
    default=None,
    help="The field naming each row's document (e.g. doc_id). Default: the "
    "source text's hash, which every OUTPUT row carries.",
)
@click.option("--name", "names", multiple=True, help="A name per system, in order. Default: the file's name.")
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Compare rows scored under different judges, prompt versions or "
    "settings (the difference is named in the output).",
)
@click.option("--resamples", type=click.IntRange(100, 1_000_000), default=10000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap and the permutations.")
def compare(results, output_path, json_path, by, names, allow_mixed, resamples, seed):
    """Which system's summaries score better, and how sure: RESULTS are two or more OUTPUTs of `sumscore score`
    (JSONL, Parquet, CSV, or folders of shards), one per system, paired by document."""
    from offline_sumscore.analysis.comparison import table, to_json
    from offline_sumscore.io.report import render_comparison
    from offline_sumscore.runs.files import compare_files

    if names and len(names) != len(results):
        raise click.UsageError(f"--name given {len(names)} times for {len(results)} RESULTS")
    try:
        report, systems = compare_files(
            results, names=names or None, by=by, allow_mixed=allow_mixed, resamples=resamples, seed=seed
        )
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    click.echo(table(report))
    if json_path:
        replace_text(json_path, to_json(report) + "\n")
        click.echo(f"{json_path}: the comparison as JSON")
    if output_path:
        page = render_comparison(
            report, {s.name: s.rows for s in systems}, title="offline_sumscore: " + " vs ".join(s.name for s in systems)
        )
        replace_text(output_path, page)
        click.echo(f"{output_path}: {len(page) // 1024} KiB")


@main.command()
@click.argument("gguf", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o",
    "--output",
    "output_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Target directory. Default: models/converted/<name> (the embedded judge's place).",
)
def convert(gguf, output_dir):
    """Convert a .gguf judge (default: the embedded one) to safetensors once, so later loads take a second.

    Safe to run twice, or from two processes at once: a lock serialises them and the result appears atomically.
    """
    from offline_sumscore.engine.judge import EMBEDDED_NAME, convert_gguf, embedded_gguf_path, models_root

    try:
        source = Path(gguf) if gguf else embedded_gguf_path()
        name = EMBEDDED_NAME if gguf is None else source.stem
        started = time.perf_counter()
        target = convert_gguf(source, Path(output_dir) if output_dir else models_root() / name)
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    click.echo(f"{target} ready ({time.perf_counter() - started:.1f} s)")


@main.command()
@click.option("--metric", type=click.Choice(["both", *METRICS]), default="both", show_default=True)
@_common
@click.option(
    "-o",
    "--output",
    "output_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the rows as JSONL here.",
)
def demo(metric, model, device, dtype, batch_size, token_budget, output_path):
    """Score the bundled examples (examples/demo.jsonl) and print the scores.

    Two-axis runs at the judge's own defaults and prints every verdict; summary-score, which makes the judge write
    keyphrases and questions, runs with small bounds (6 keyphrases, 3 questions) so it finishes in a minute on a CPU.
    """
    caps = {"two-axis": {}, "summary-score": dict(max_questions=3, max_keyphrases=6, max_text_chars=100)}
    path = resources.files("offline_sumscore") / "examples" / "demo.jsonl"
    try:
        samples = list(read_samples(Path(str(path))))
        from offline_sumscore.engine.judge import load_judge

        started = time.perf_counter()
        judge = load_judge(model, device=device, dtype=dtype)
        click.echo(
            f"judge {judge.name} ({judge.device}, {judge.dtype}) loaded in {time.perf_counter() - started:.1f} s"
        )
        out = open(output_path, "w", encoding="utf-8") if output_path else None
        failed = False
        for name in METRICS if metric == "both" else [metric]:
            scorer = METRICS[name](judge, batch_size=batch_size, token_budget=token_budget, **caps[name])
            began = time.perf_counter()
            rows = [r.to_dict() for r in scorer.score_many(samples, on_error="return")]
            click.echo(_table(name, rows, time.perf_counter() - began))
            if out:
                out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            for row in rows:
                if row.get("error"):
                    failed = True
                    click.echo(f"  {row['id']}: FAILED {row['error']['message']}")
                elif name == "two-axis":
                    click.echo(f"  {row['id']}: {row['score']:.2f}  {row['reason']}")
                    for claim in row["claims"]:
                        click.echo(
                            f"      claim    {'supported  ' if claim['supported'] else 'UNSUPPORTED'} "
                            f"P={_p(claim['p_supported'])}  {claim['claim']}"
                        )
                    for item, verdict in zip(row["questions"], row["coverage_verdicts"]):
                        click.echo(
                            f"      coverage {'covered    ' if verdict['answered'] else 'MISSED     '} "
                            f"P={_p(verdict['p_answered'])}  {item}"
                        )
                else:
                    click.echo(
                        f"  {row['id']}: {row['score']:.3f}  (QA {row['qa']:.2f}, conciseness {row['conciseness']:.2f})"
                    )
        if out:
            out.close()
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    if failed:
        sys.exit(EXIT_ROWS_FAILED)
