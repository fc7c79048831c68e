"""`sumscore score` without --model scores with the 1.5B, and its peak memory stays under 4 GB: the judge holds its
GGUF's block codes, never a float copy of its weights. (The run: conftest's default_cli_demo.)"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def test_score_without_a_model_uses_the_default_instruct_judge(default_cli_demo):
    rows, peak = default_cli_demo
    assert peak < 4e9, f"peak {peak / 1e9:.2f} GB"
    assert sorted(rows) == ["faithful", "thin", "wrong-fact"]
    for row in rows.values():
        assert row["judge"]["name"] == "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    assert rows["thin"]["questions"] and rows["thin"]["coverage"] < 1.0
