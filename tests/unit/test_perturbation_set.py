"""The committed perturbation set (research/data/perturbations.jsonl, read as data): at least 600 pairs of 6 or more
types, each with a paraphrase control, the edit recorded. That its generator writes it again from its recorded seed
is research's own check: `python -m research.perturbations --data-dir DIR --check`."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "research" / "data" / "perturbations.jsonl"


def test_the_committed_set_has_600_pairs_of_at_least_6_types_each_with_a_control():
    rows = [json.loads(line) for line in SET.open()]
    counts = json.loads(SET.with_suffix(".counts.json").read_text())
    assert len(rows) == counts["pairs"] >= 600 and len({r["type"] for r in rows}) >= 6
    for r in rows:
        assert r["original"] in r["source"]  # copied from its source
        assert r["perturbed"] != r["original"] and r["paraphrase"] != r["original"] and r["edit"]
    assert len({r["id"] for r in rows}) == len(rows)
