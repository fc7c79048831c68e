"""The evidence a row shows, measured: on faithful sentences, how often it accuses a correct word (precision), and on
contradicted ones, how often it names the word that was changed (recall), with the embedded judge.

    python -m research.evidence_precision                       # this checkout
    python -m research.evidence_precision --tree /tmp/before --name evidence_before   # another checkout's rules

The perturbation set (data/perturbations.jsonl: a sentence copied from its source, a faithful paraphrase of it, and
a copy with one fact changed) is scored as support claims, each sentence against its source, through the scorer's own
stages (VerdictStage: the likelihood verdict, its conflict and weakest-word evidence) and, where the tree has it, the
model-free figure check (core.figures). Evidence shown on a sentence: a conflict (a word the judge found contradicted,
with the word it expected) or a figure the source does not state. Reported per part (summeval: where rules are chosen;
frank: held out) and type: faithful sentences with any evidence shown (an accusation of a correct word: the lower the
better), contradicted sentences whose changed word is named (the higher the better), and, where a word is named, the
share whose expected word is a whole word of the source (never a token's piece). Writes results/NAME.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def in_tree(tree: Path) -> int:
    """This script again, in a process whose PYTHONPATH puts the tree first, so that its package is the one imported
    (run by its path, the child sees neither this checkout's root nor its package). Returns the child's exit code."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode


def load_tree(tree: Path | None):
    import offline_sumscore

    if tree is not None and not offline_sumscore.__file__.startswith(str(tree.resolve())):
        raise SystemExit(f"imported {offline_sumscore.__file__}, not the tree {tree}")
    from offline_sumscore.engine.judge import load_judge
    from offline_sumscore.engine.local import TransformersEngine
    from offline_sumscore.scorers.stages.verdict import VerdictStage

    try:
        from offline_sumscore.core.figures import figure_check
    except ImportError:  # a tree before the figure check
        figure_check = None
    return load_judge, TransformersEngine, VerdictStage, figure_check


def changed_words(row: dict) -> set[str]:
    """The words the perturbation put in ("1 -> 2": {"2"}; "won -> lost": {"lost"})."""
    _, _, new = row["edit"].partition(" -> ")
    return {w.strip(".,;:'\"") for w in new.split()} if new else set()


def shown(entry: dict, figures: list[dict]) -> list[str]:
    """The words a row's evidence accuses: its conflict's word and every figure the source does not state."""
    words = [f["figure"] for f in figures]
    if entry.get("conflict"):
        words.append(entry["conflict"]["word"])
    return words


def whole_word(expected: str | None, source: str) -> bool:
    import re

    return bool(expected) and re.search(r"(?<!\w)" + re.escape(expected) + r"(?!\w)", source) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=None, help="a checkout whose rules to measure (default: this one)")
    ap.add_argument("--name", default="evidence_precision")
    ap.add_argument("--limit", type=int, default=None, help="rows of the set (default: all)")
    args = ap.parse_args()
    if args.tree is not None and os.environ.get("PYTHONPATH") != str(args.tree.resolve()):
        sys.exit(in_tree(args.tree))
    load_judge, TransformersEngine, VerdictStage, figure_check = load_tree(args.tree)
    rows = [json.loads(line) for line in (HERE / "data" / "perturbations.jsonl").read_text().splitlines()]
    rows = rows[: args.limit] if args.limit else rows
    engine = TransformersEngine(load_judge("smollm2-135m"))
    stage = VerdictStage("likelihood", "bare", False, 200, 2.0)
    cases = [(r, kind, r[kind]) for r in rows for kind in ("original", "paraphrase", "perturbed")]
    requests = [q for r, _, text in cases for q in stage.requests(r["id"], "support", r["source"], text)]
    results = engine.run(requests)
    tally: dict = defaultdict(lambda: defaultdict(int))
    for k, (row, kind, text) in enumerate(cases):
        entry = stage.read(results[2 * k : 2 * k + 2], {}, f"support.{k}", row["source"])
        figures = figure_check(text, row["source"]) if figure_check else []
        words = shown(entry, figures)
        key = (row["part"], row["type"])
        if kind == "perturbed":
            tally[key]["contradicted"] += 1
            tally[key]["named"] += bool(changed_words(row) & {w.strip(".,;:'\"") for w in words})
            tally[key]["failed"] += not entry["verdict"]
        else:
            tally[key]["faithful"] += 1
            tally[key]["accused"] += bool(words)
            tally[key]["passed"] += entry["verdict"]
        conflict = entry.get("conflict")
        if conflict:
            tally[key]["conflicts"] += 1
            tally[key]["whole"] += whole_word(conflict.get("expected_word"), row["source"])
    write(args, tally)


def write(args, tally) -> None:
    lines = [f"# Evidence on the perturbation set: {args.name}", "", f"`{' '.join(sys.argv)}`", ""]
    lines += [
        "| part | type | faithful: any word accused | contradicted: the changed word named | "
        "contradicted: verdict no | faithful: verdict yes | conflicts whose expected word is a whole word |",
        "|---|---|---|---|---|---|---|",
    ]
    totals: dict = defaultdict(lambda: defaultdict(int))
    for (part, kind), t in sorted(tally.items()):
        for name, n in t.items():
            totals[part][name] += n
        lines.append(_line(part, kind, t))
    for part, t in sorted(totals.items()):
        lines.append(_line(f"**{part}**", "**all**", t))
    (HERE / "results" / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (HERE / "results" / f"{args.name}.json").write_text(
        json.dumps({f"{p}/{k}": dict(t) for (p, k), t in tally.items()}, indent=1)
    )
    print("\n".join(lines))


def _line(part: str, kind: str, t: dict) -> str:
    def pct(a: str, b: str) -> str:
        return f"{t[a] / t[b]:.0%} ({t[a]} of {t[b]})" if t[b] else "-"

    return (
        f"| {part} | {kind} | {pct('accused', 'faithful')} | {pct('named', 'contradicted')} | "
        f"{pct('failed', 'contradicted')} | {pct('passed', 'faithful')} | {pct('whole', 'conflicts')} |"
    )


if __name__ == "__main__":
    main()
