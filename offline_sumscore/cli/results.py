"""`sumscore report` and `sumscore compare`: what a run's OUTPUT says, as a page or against another system."""

from __future__ import annotations

from pathlib import Path

import click

from offline_sumscore.cli.app import InputProblem, input_options, main, output_option, write_text
from offline_sumscore.core.errors import SumscoreError


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@output_option("The page.", default="report.html", show_default=True)
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
    write_text(output_path, page)
    click.echo(f"{output_path}: {len(rows)} rows, {len(page) // 1024} KiB")


@main.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True))
@output_option("Also write the comparison as one self-contained HTML page.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the comparison as JSON, for scripts.",
)
@click.option(
    "--system-field",
    default=None,
    help="The field naming each row's system (e.g. model, a column of INPUT): the systems are taken from the rows "
    "of RESULTS (one file will do) instead of one file per system.",
)
@click.option(
    "--document-field",
    "--by",
    "by",
    default=None,
    help="The field naming each row's document (e.g. doc, a column of INPUT). Default: the source text's hash, "
    "which every OUTPUT row carries.",
)
@input_options(texts=False)
@click.option("--name", "names", multiple=True, help="A name per system, in order. Default: the file's name.")
@click.option(
    "--allow-mixed",
    is_flag=True,
    help="Compare rows scored under different judges, prompt versions or "
    "settings (the difference is named in the output).",
)
@click.option("--resamples", type=click.IntRange(100, 1_000_000), default=10000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap and the permutations.")
def compare(results, output_path, json_path, system_field, by, id_field, names, allow_mixed, resamples, seed):
    """Which system's summaries score better, and how sure: RESULTS are two or more OUTPUTs of `sumscore score`
    (JSONL, Parquet, CSV, or folders of shards), one per system, or one OUTPUT whose rows name their system
    (--system-field model), paired by document."""
    from offline_sumscore.analysis.comparison import table, to_json
    from offline_sumscore.io.report import render_comparison
    from offline_sumscore.runs.files import compare_files

    if names and len(names) != len(results):
        raise click.UsageError(f"--name given {len(names)} times for {len(results)} RESULTS")
    try:
        report, systems = compare_files(
            results,
            names=names or None,
            by=by,
            system_field=system_field,
            id_field=id_field,
            allow_mixed=allow_mixed,
            resamples=resamples,
            seed=seed,
        )
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    click.echo(table(report))
    if json_path:
        write_text(json_path, to_json(report) + "\n")
        click.echo(f"{json_path}: the comparison as JSON")
    if output_path:
        page = render_comparison(
            report, {s.name: s.rows for s in systems}, title="offline_sumscore: " + " vs ".join(s.name for s in systems)
        )
        write_text(output_path, page)
        click.echo(f"{output_path}: {len(page) // 1024} KiB")
