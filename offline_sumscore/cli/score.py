"""`sumscore score`: every row of a file scored into OUTPUT, with the engine the flags choose."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from offline_sumscore.cli.app import (
    EXIT_NO_ROWS,
    EXIT_ROWS_FAILED,
    InputProblem,
    WriteProblem,
    default_of,
    input_options,
    interruptible,
    judge_options,
    main,
    run_table,
    scorer_options,
    typed_flag,
)
from offline_sumscore.core.errors import InputError, SumscoreError, WriteError
from offline_sumscore.runs.bulk import DEFAULT_CHUNK_SIZE
from offline_sumscore.scorers import METRICS, SummarizationScorer, SummaryScore


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
@judge_options
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
    f"{default_of(SummarizationScorer, 'key_sentences')}).",
)
@click.option(
    "--likelihood-threshold",
    type=float,
    default=None,
    help=f"two-axis: nats per token for a likelihood 'yes' (default "
    f"{default_of(SummarizationScorer, 'likelihood_threshold')}, set on the embedded judge).",
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
    "--answers",
    type=click.Choice(["auto", "questions", "likelihood"]),
    default=None,
    help="summary-score: questions (Ragas: keyphrases, questions, answers) or likelihood (the text's key sentences "
    "checked against the summary: the embedded judge's mode); auto follows the judge.",
)
@click.option(
    "--no-length-penalty", "length_penalty", flag_value=False, default=None, help="summary-score: score = QA alone."
)
@click.option(
    "--max-claims",
    type=int,
    default=None,
    help=f"two-axis: safety bound on one claims list; a list that reaches it is drawn again from halves of "
    f"the summary, never cut (default {default_of(SummarizationScorer, 'max_claims')}).",
)
@click.option(
    "--max-keyphrases",
    type=int,
    default=None,
    help=f"summary-score: safety bound on keyphrases (default {default_of(SummaryScore, 'max_keyphrases')}).",
)
@click.option("--max-text-chars", type=int, default=None, help="Cap on each claim/question/keyphrase (default 200).")
@click.option("--max-reason-chars", type=int, default=None, help="two-axis: cap on each reason (default 200).")
@input_options()
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
    default=None,
    help="Rows scored at once in one stream through the judge (a new one starts as one finishes). Default: the "
    "engine's: 32 on a CPU, a quarter of the row cap on a GPU (128).",
)
@click.option(
    "--judge-url",
    default=None,
    help="Use a judge served elsewhere on this machine: an OpenAI-compatible base URL, e.g. "
    "http://127.0.0.1:8000/v1 (vLLM, llama.cpp server, Ollama, transformers serve).",
)
@click.option("--judge-model", default=None, help="With --judge-url: the model name the server knows.")
@click.option(
    "--judge-api-key",
    envvar="OFFLINE_SUMSCORE_JUDGE_API_KEY",
    default=None,
    help="With --judge-url: the server's API key, sent as a bearer token (or $OFFLINE_SUMSCORE_JUDGE_API_KEY, which "
    "keeps it out of the shell's history); never written to OUTPUT or a report.",
)
@click.option(
    "--judge-concurrency",
    type=int,
    default=None,
    help="With --judge-url: requests at once. Default: llama.cpp's slots where the server is llama-server (its /props "
    "page's total_slots; more would wait at the server, their timeouts running), else 4.",
)
@click.option(
    "--judge-timeout",
    type=float,
    default=120,
    show_default=True,
    help="With --judge-url: seconds a request may take, its retries included; past them its row fails, naming it.",
)
@click.option(
    "--engine",
    "engine_kind",
    type=click.Choice(["auto", "local", "vllm", "ray"]),
    default="auto",
    show_default=True,
    help="vllm: vLLM's engine in this process (pip install 'offline-sumscore[vllm]'). local: ours. auto: ours on a "
    "CPU; on a CUDA GPU vLLM where it is installed, else ours (the run says which and why). ray: a pool of Ray "
    "actors, one loaded judge each (pip install 'offline-sumscore[ray]').",
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
@click.option(
    "--calibration",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="two-axis: the likelihood threshold from `sumscore calibrate` (its JSON).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def score(input_path, output_path, metric, quiet, calibration, **opts):
    """Score every row of INPUT (JSONL, CSV, Parquet or a datasets save_to_disk directory, with source and summary
    fields and an optional id) into OUTPUT.

    Rows are written as they are scored; after a crash, --resume finishes the run. A row that cannot be scored is
    written with an "error" (stage, cause, message) and the run goes on; the exit code is 1 if any row failed.
    """
    taken = {name: opts.pop(name) for name in (*FILE_OPTIONS, *JUDGE_OPTIONS, *RAY_OPTIONS, *CACHE_OPTIONS)}
    calibrated = _calibration(calibration, opts)
    try:
        cache = _cache(**{k: taken[k] for k in CACHE_OPTIONS})
        if quiet:  # quiet means quiet: no weight-loading bars either
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        run = _score_file(input_path, output_path, metric, quiet, opts, taken, cache)
    except InputError as exc:
        if exc.cause != "no_rows":
            raise InputProblem(str(exc)) from None
        click.echo(f"warning: {exc}", err=True)
        sys.exit(EXIT_NO_ROWS)
    except WriteError as exc:
        raise WriteProblem(str(exc)) from None
    except SumscoreError as exc:  # a scorer names its parameter (batch_size); here the user typed a flag
        raise InputProblem(
            re.sub(r"^([a-z_]+) (?=must|should)", lambda m: f"{typed_flag(m.group(1))} ", str(exc))
        ) from None
    _warn_about_verdicts(run.report.rows, calibrated)
    _say_how_it_went(metric, run, cache, on_ray=taken["engine_kind"] == "ray")


def _calibration(path: str | None, opts: dict) -> dict | None:
    """--calibration: its threshold becomes --likelihood-threshold (giving both is refused)."""
    if path is None:
        return None
    if opts.get("likelihood_threshold") is not None:
        raise click.UsageError("give --calibration or --likelihood-threshold, not both")
    try:
        found = json.loads(Path(path).read_text())
        opts["likelihood_threshold"] = float(found["likelihood_threshold"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InputProblem(f"{path} is not a calibration from `sumscore calibrate`: {exc}") from None
    return found


def _warn_about_verdicts(rows, calibrated: dict | None) -> None:
    """Once per run: verdicts all on one side (the threshold does not fit the text), or a calibration made on
    another judge, or under another likelihood rule (an older version's), than the rows were scored with. The rows
    are read twice, one at a time: a long run's rows come from its file, never all at once."""
    from offline_sumscore.analysis.calibration import is_likelihood_row, one_sided_run
    from offline_sumscore.analysis.run_notes import run_notes

    said = one_sided_run(rows)
    if said:
        click.echo(f"warning: {said}", err=True)
    for note in run_notes(rows):
        click.echo(f"note: {note}", err=True)
    identities, rules = set(), set()
    for r in rows:
        if is_likelihood_row(r):
            identities.add((r.get("judge") or {}).get("identity"))
            rules.add((r.get("settings") or {}).get("design.likelihood_rule"))
    rules -= {None}
    wanted = ((calibrated or {}).get("judge") or {}).get("identity")
    if calibrated and wanted not in identities and identities:
        click.echo(
            f"warning: the calibration was made on judge {calibrated['judge'].get('name')} ({wanted}), not on the "
            "judge that scored these rows: its threshold is that judge's; calibrate again on this one",
            err=True,
        )
    if calibrated and rules and calibrated.get("likelihood_rule") not in rules:
        click.echo(
            f"warning: the calibration was made under another likelihood rule ({calibrated.get('likelihood_rule')!r}; "
            f"these rows: {' / '.join(map(repr, sorted(rules)))}): its threshold reads other numbers; calibrate again",
            err=True,
        )


FILE_OPTIONS = (
    "output_format",
    "shard_rows",
    "shard_format",
    "resume",
    "chunk_size",
    "in_flight",
    "fail_fast",
    "allow_long_summary",
    "source_field",
    "summary_field",
    "id_field",
)
JUDGE_OPTIONS = ("judge_url", "judge_model", "judge_api_key", "judge_concurrency", "judge_timeout")
RAY_OPTIONS = ("engine_kind", "ray_address", "num_judges", "gpus_per_judge", "cpus_per_judge")
CACHE_OPTIONS = ("cache_path", "no_cache")


def _cache(cache_path, no_cache):
    from offline_sumscore.engine.stage_cache import StageCache, default_cache_path

    def warn(message: str) -> None:
        click.echo(f"warning: {message}", err=True)

    return None if no_cache else StageCache(cache_path or default_cache_path(), warn=warn)


def _score_file(input_path, output_path, metric: str, quiet: bool, opts: dict, taken: dict, cache):
    """score_file with the engine spec the flags give; score_file resolves its auto (build.resolve: --judge-url
    makes it a served judge), as it does for every caller."""
    from offline_sumscore.engine.build import EngineSpec
    from offline_sumscore.runs.files import Output, score_file

    spec = EngineSpec(  # it refuses flags that do not combine (--engine local with --judge-url, ...), by name
        kind=taken["engine_kind"],
        model=opts.pop("model"),
        device=opts.pop("device") or "auto",
        dtype=opts.pop("dtype") or "auto",
        batch_size=opts.pop("batch_size"),
        token_budget=opts.pop("token_budget"),
        url=taken["judge_url"],
        served_model=taken["judge_model"],
        api_key=taken["judge_api_key"],
        concurrency=taken["judge_concurrency"],
        timeout=taken["judge_timeout"],
        ray_address=taken["ray_address"],
        num_judges=taken["num_judges"],
        gpus_per_judge=taken["gpus_per_judge"],
        cpus_per_judge=taken["cpus_per_judge"],
    )

    def say(message: str) -> None:
        click.echo(message, err=True)

    with interruptible(Output.at(output_path, taken["output_format"]).record):
        return score_file(
            input_path,
            output_path,
            metric=metric,
            options=scorer_options(metric, opts),
            cache=cache,
            engine=spec,
            **{k: taken[k] for k in FILE_OPTIONS},
            progress=lambda total: click.progressbar(
                length=total, label=f"scoring ({metric})", file=sys.stderr, hidden=quiet
            ),
            notify=None if quiet else say,
            warn=say,
        )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole if whole else 0:.0f}%"


def _say_how_it_went(metric: str, run, cache, *, on_ray: bool) -> None:
    """The run's table, the rows kept from an earlier run, the stage cache's hits, the failed rows by cause (and exit
    1 if any failed)."""
    report = run.report
    click.echo(run_table(metric, report.rows, run.seconds))
    scored_here = run.bad_rows < len(report.rows) and not on_ray
    stacked = run.scorer.stacked_engine if scored_here else None
    if report.resumed:
        click.echo(
            f"{report.resumed} rows kept from OUTPUT"
            + (" (a torn last line was cut and redone)" if report.torn_tail else "")
        )
    if cache is not None and stacked is not None:
        asked = stacked.hits + stacked.twins + stacked.computed
        said = [f"{stacked.hits} of {asked} stage requests answered from it ({_percent(stacked.hits, asked)})"]
        if stacked.twins:  # identical requests in flight are computed once, with or without a cache file
            said.append(f"{stacked.twins} the same as one in flight (computed once)")
        said.append(f"{stacked.computed} sent to the judge")
        off = "" if cache.readable else "; the cache was off after the warning above"
        click.echo(f"stage cache {cache.path}: {', '.join(said)}{off}")
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
        from offline_sumscore.runs.bulk import redo_on_resume

        if any(redo_on_resume(r) for r in failed):
            click.echo("rows the judge's engine or server failed (cause ...:model) are scored again by --resume")
    where = f"into the folder {run.output.path}" if run.output.sharded else f"to {run.output.path}"
    click.echo(f"wrote {len(report.rows)} rows {where}")  # last: where the run wrote, whatever else it said
    if failed:
        sys.exit(EXIT_ROWS_FAILED)
