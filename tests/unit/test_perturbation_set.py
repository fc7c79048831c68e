"""The committed perturbation set (benchmarks/data/perturbations.jsonl) is what its generator writes: at least 600
pairs of 6 or more types, each with a paraphrase control, the edit recorded; the generator is deterministic for its
seed (checked where the development data it reads is present)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SET = ROOT / "benchmarks" / "data" / "perturbations.jsonl"


def test_the_committed_set_has_600_pairs_of_at_least_6_types_each_with_a_control():
    rows = [json.loads(line) for line in SET.open()]
    counts = json.loads(SET.with_suffix(".counts.json").read_text())
    assert len(rows) == counts["pairs"] >= 600 and len({r["type"] for r in rows}) >= 6
    for r in rows:
        assert r["original"] in r["source"]  # copied from its source
        assert r["perturbed"] != r["original"] and r["paraphrase"] != r["original"] and r["edit"]
    assert len({r["id"] for r in rows}) == len(rows)


def test_the_generator_writes_the_committed_set_again(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perturbations

    if not (perturbations.DATA / "summeval_dev.jsonl").exists():
        pytest.skip(f"the development data is not here ({perturbations.DATA})")
    counts = json.loads(SET.with_suffix(".counts.json").read_text())
    rows = perturbations.generate(counts["seed"], counts["per_type"], counts["source_chars"])
    assert [json.dumps(r, ensure_ascii=False) for r in rows] == SET.read_text().splitlines()
