"""What every command shares: the `sumscore` group, exit codes, the judge's flags, one-line errors, the run table."""

from __future__ import annotations

import contextlib
import heapq
import inspect
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from offline_sumscore.core.results import EMBEDDED_JUDGE_NOTE, first_clause, row_label, scored_by_embedded
from offline_sumscore.scorers import METRICS
from offline_sumscore.scorers.base import ScorerBase

EXIT_ROWS_FAILED = 1
EXIT_NO_ROWS = 3
EXIT_WRITE_FAILED = 4  # a file could not be written (no space, permission, I/O): every row already written is kept
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + the signal's number, as shells report them


class Terminated(BaseException):
    """SIGTERM, raised where the run can say what it kept (Ctrl-C is Python's KeyboardInterrupt). A BaseException, as
    KeyboardInterrupt is, so that no layer that retries a failed engine call swallows it."""


@contextlib.contextmanager
def interruptible(record: str):
    """Ctrl-C (130) or SIGTERM (143) during a run: say how many rows OUTPUT kept and how to finish, then exit. SIGINT
    reaches the run as KeyboardInterrupt whatever it inherited: the command group installs Python's handler
    (SumscoreGroup)."""

    def on_term(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except (KeyboardInterrupt, Terminated) as exc:
        from offline_sumscore.runs.record import finished_count

        kept = finished_count(Path(record)) if Path(record).exists() else 0
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


class WriteProblem(click.ClickException):
    """A file the command writes could not be written: one line naming it and the cause, exit code 4."""

    exit_code = EXIT_WRITE_FAILED


def write_text(path: str | Path, text: str) -> None:
    """A page or a JSON file the command writes, whole or not at all; a failure is a WriteProblem, not a traceback."""
    from offline_sumscore.core.durable import replace_text
    from offline_sumscore.core.errors import WriteError

    try:
        replace_text(path, text)
    except OSError as exc:
        raise WriteProblem(str(WriteError(path, exc))) from None


def default_of(cls, name: str) -> Any:
    return inspect.signature(cls.__init__).parameters[name].default


def scorer_options(metric: str, opts: dict) -> dict:
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


def typed_flag(parameter: str) -> str:
    """The flag a user typed for a keyword parameter that an error names."""
    return FLAG_OF.get(parameter, "--" + parameter.replace("_", "-"))


WORST_SHOWN = 5  # rows named under the means: enough to start reading, few enough to stay on a screen


def run_table(metric: str, rows: Iterable[dict], seconds: float, *, details: bool = True) -> str:
    """The run's means; with details, its lowest rows (score, the row, the reason's first clause) and, where the
    embedded judge scored, what that judge is good for (the demo, which shows every row, says that once itself).
    One pass over the rows, keeping only sums and the lowest few: a long run's rows are read from its file."""
    cols = ["score", "alignment", "coverage"] if metric == "two-axis" else ["score", "qa", "conciseness"]
    sums, counts = dict.fromkeys(cols, 0.0), dict.fromkeys(cols, 0)
    total = ok = tokens_in = tokens_out = 0
    lowest: list[tuple[float, int, dict]] = []  # a max-heap of the WORST_SHOWN lowest scores, by their negation
    embedded = False
    for n, r in enumerate(rows):
        total += 1
        stages = (r.get("stages") or {}).values()
        tokens_in += sum(s["tokens_in"] for s in stages)  # shared prefixes counted per row
        tokens_out += sum(s["tokens_out"] for s in stages)
        embedded = embedded or scored_by_embedded(r)
        if r.get("error") is not None:
            continue
        ok += 1
        for c in cols:
            if r.get(c) is not None:
                sums[c], counts[c] = sums[c] + r[c], counts[c] + 1
        if details and r.get("score") is not None:
            heapq.heappush(lowest, (-r["score"], -n, r))
            if len(lowest) > WORST_SHOWN:
                heapq.heappop(lowest)
    lines = [
        f"metric {metric}: {total} rows, {total - ok} failed, {seconds:.1f} s, "
        f"{tokens_in} tokens in, {tokens_out} tokens out",
        " | ".join(f"mean {c}" for c in cols),
        " | ".join(f"{sums[c] / counts[c]:.3f}" if counts[c] else "-" for c in cols),
    ]
    if not details:
        return "\n".join(lines)
    shown = [r for _, _, r in sorted(lowest, key=lambda entry: (-entry[0], -entry[1]))]
    if ok > 1 and shown:
        lines.append(f"lowest {len(shown)} of {ok}:")
        lines += [f"  {r['score']:.3f}  {row_label(r)}: {_why(r, cols)}" for r in shown]
    if embedded:
        lines.append(f"note: {EMBEDDED_JUDGE_NOTE}")
    return "\n".join(lines)


def _why(row: dict, cols: list[str]) -> str:
    """A row's reason's first clause, or, for a metric without reasons, the parts of its score."""
    if row.get("reason"):
        return first_clause(row["reason"])
    return ", ".join(f"{c} {row[c]:.2f}" for c in cols[1:] if isinstance(row.get(c), (int, float)))


def p_text(value: float | None) -> str:
    return "-   " if value is None else f"{value:.2f}"


def print_versions(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from offline_sumscore.core.version import VERSION
    from offline_sumscore.engine.versions import version_text

    click.echo(version_text(VERSION))
    ctx.exit()


class SumscoreGroup(click.Group):
    """Every command stops at SIGINT within seconds, however it was started: Python's own handler is installed
    whatever the command inherited (a shell without job control, as a script's `sumscore score ... &`, starts its
    background jobs with SIGINT ignored, and such a run ignored Ctrl-C and `kill -INT` to its end), and an interrupt
    that no command says more about ends with one line and 130, not click's "Aborted!" and 1. `score` says what
    OUTPUT kept (interruptible); `setup` what to run again."""

    def invoke(self, ctx):
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            name = ctx.invoked_subcommand or "the command"
            click.echo(f"interrupted: {name} stopped before it finished; nothing it had not written is kept", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=SumscoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=print_versions,
    help="Show this version, torch's, transformers', outlines', llguidance's and vLLM's, and the device torch sees.",
)
def main():
    """Score summaries against their sources with a local LLM judge. No network, no hosted API."""


def judge_options(fn):
    options = [
        click.option(
            "--model",
            type=click.Path(),
            default=None,
            help="Model directory, .gguf file or preset name (`sumscore models`). Default: qwen2.5-coder-1.5b "
            "(`sumscore setup --judge qwen2.5-coder-1.5b` fetches it), or $OFFLINE_SUMSCORE_JUDGE; "
            "smollm2-135m is the small embedded judge.",
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
            default=default_of(ScorerBase, "batch_size"),
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


def input_options(texts: bool = True):
    """The flags that say which field of a row is what, the same on every command that reads rows (score,
    calibrate: the texts and the id; compare: the id); a missing field's error proposes its flag."""
    options = [click.option("--id-field", default="id", show_default=True, help="The field naming each row.")]
    if texts:
        options = [
            click.option(
                "--source-field", default="source", show_default=True, help="The field holding the text summarized."
            ),
            click.option(
                "--summary-field", default="summary", show_default=True, help="The field holding the summary."
            ),
            *options,
        ]

    def decorate(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return decorate


def output_option(help: str, *, dest: str = "output_path", file: bool = True, **kwargs):
    """-o/--output: a file (or with file=False, a directory) the command writes."""
    kind = click.Path(dir_okay=False) if file else click.Path(file_okay=False)
    return click.option("-o", "--output", dest, type=kind, default=kwargs.pop("default", None), help=help, **kwargs)
