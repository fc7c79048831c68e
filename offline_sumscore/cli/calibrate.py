"""`sumscore calibrate`: the likelihood threshold for the user's kind of text, from a few labelled rows."""

from __future__ import annotations

import json
import sys

import click

from offline_sumscore.cli.app import InputProblem, input_options, judge_options, main, output_option, write_text
from offline_sumscore.core.errors import SumscoreError


@main.command()
@click.argument("labelled", type=click.Path(exists=True))
@input_options()
@click.option("--label-field", default="label", show_default=True, help="consistent/inconsistent, true/false, 1/0.")
@judge_options
@output_option("Write the calibration here (JSON), for `sumscore score --calibration`.", default="calibration.json")
@click.option("--resamples", type=click.IntRange(100, 100_000), default=2000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def calibrate(
    labelled,
    source_field,
    summary_field,
    id_field,
    label_field,
    model,
    device,
    dtype,
    batch_size,
    token_budget,
    output_path,
    resamples,
    seed,
    quiet,
):
    """Choose the likelihood threshold from LABELLED rows (source, summary and a label, consistent or not): the one
    whose verdicts agree best with the labels (balanced accuracy), with bootstrap intervals, and the flags to use.

    Calibrate when your text is not news: the 2.0-nat default was chosen on news sentences, and a faithful
    paraphrase of a dialogue or meeting sits below it, so every claim would come out unsupported.
    """
    from offline_sumscore.runs.calibrate import calibrate_file

    if quiet:  # quiet means quiet: no weight-loading bars either
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    options = {
        k: v
        for k, v in dict(device=device, dtype=dtype, batch_size=batch_size, token_budget=token_budget).items()
        if v is not None
    }
    try:
        run = calibrate_file(
            labelled,
            model=model,
            options=options,
            label_field=label_field,
            fields=dict(source_field=source_field, summary_field=summary_field, id_field=id_field),
            resamples=resamples,
            seed=seed,
            progress=not quiet,
        )
    except (SumscoreError, ValueError) as exc:
        raise InputProblem(str(exc)) from None
    c = run.calibration
    t_ci = f" [{c.threshold_interval[0]:.2f}, {c.threshold_interval[1]:.2f}]" if c.threshold_interval else ""
    ba_ci = (
        f" [{c.balanced_accuracy_interval[0]:.2f}, {c.balanced_accuracy_interval[1]:.2f}]"
        if c.balanced_accuracy_interval
        else ""
    )
    click.echo(
        f"threshold {c.threshold:.3f} nats per token{t_ci}: balanced accuracy {c.balanced_accuracy:.3f}{ba_ci} on "
        f"{c.rows} rows ({c.consistent} consistent), judge {run.judge['name']}"
        + (f"; {run.failed} rows the judge could not score were left out" if run.failed else "")
    )
    write_text(output_path, json.dumps(run.to_dict(), indent=1) + "\n")
    click.echo(f"score with: --likelihood-threshold {c.threshold:g}  (or --calibration {output_path})")
    if c.rows < 20:
        click.echo(
            f"warning: {c.rows} rows are few; the interval above says how far the threshold may be off", err=True
        )
        sys.stderr.flush()
