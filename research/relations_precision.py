"""The role and quantity-word checks (core/relations.py), measured on real summaries: how many summaries that their
annotators found consistent get a finding (each one a false accusation), and how many with errors do.

    python -m research.relations_precision --data-dir DIR   # results/relations_precision.md; -v: every finding

Reads the agreement files in DIR (SummEval dev: consistency 5 from every expert is faithful; FRANK: no sentence with
an error). Each summary sentence is checked as a claim against its source, with the whole summary for the role check's
"the summary names the other one". No model.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

from offline_sumscore.core.coverage_items import summary_sentences
from offline_sumscore.core.relations import quantity_check, role_check

HERE = Path(__file__).resolve().parent
SETS = {
    "summeval_dev": lambda human: human["consistency"] >= 5,
    "frank_finesure_gpt4o": lambda human: human["summary_has_error"] == 0,
}


def human_of(row: dict) -> dict:
    return row["human"] if isinstance(row["human"], dict) else ast.literal_eval(row["human"])


def findings(row: dict) -> list[tuple[str, dict]]:
    out = []
    for sentence in summary_sentences(row["summary"]):
        for found in role_check(sentence, row["source"], row["summary"]) + quantity_check(sentence, row["source"]):
            out.append((sentence, found))
    return out


def perturbation_counts() -> dict[str, list[tuple[int, int]]]:
    """Per part: (found, of) for copies, paraphrases, role swaps and every other kind of change."""
    out: dict[str, list[list[int]]] = {}
    for line in (HERE / "data" / "perturbations.jsonl").read_text().splitlines():
        row = json.loads(line)
        counts = out.setdefault(row["part"], [[0, 0] for _ in range(4)])
        texts = [(0, row["original"]), (1, row["paraphrase"]), (2 if row["type"] == "role" else 3, row["perturbed"])]
        for at, text in texts:
            counts[at][0] += bool(role_check(text, row["source"], text) + quantity_check(text, row["source"]))
            counts[at][1] += 1
    return {part: [tuple(c) for c in counts] for part, counts in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="the folder of the agreement files")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    lines = [
        "# Roles and quantity words on real summaries",
        "",
        "| set | faithful summaries | with a finding | summaries with errors | with a finding |",
        "|---|---|---|---|---|",
    ]
    for name, faithful in SETS.items():
        rows = [json.loads(line) for line in (args.data_dir / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        tally = {True: [0, 0], False: [0, 0]}
        for row in rows:
            ok = faithful(human_of(row))
            found = findings(row)
            tally[ok][0] += 1
            tally[ok][1] += bool(found)
            if args.verbose:
                for sentence, f in found:
                    print(
                        f"{'FAITHFUL' if ok else 'error'} {row['id']}: {sentence!r} {f['word']} -> {f['source_says']}"
                    )
        lines.append(f"| {name} | {tally[True][0]} | {tally[True][1]} | {tally[False][0]} | {tally[False][1]} |")
    lines += [
        "",
        "The sentence perturbation set (data/perturbations.jsonl): each source sentence copied, paraphrased, and",
        "changed once; a finding on a copy or a paraphrase is a false accusation.",
        "",
        "| part | copies with a finding | paraphrases with a finding | role swaps found | other changes found |",
        "|---|---|---|---|---|",
    ]
    for part, counts in perturbation_counts().items():
        lines.append(f"| {part} | " + " | ".join(f"{k} of {n}" for k, n in counts) + " |")
    text = "\n".join(lines) + "\n"
    (HERE / "results" / "relations_precision.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
