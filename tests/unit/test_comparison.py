"""sumscore compare's statistics on cases worked out by hand (no model)."""

import math

import pytest

from offline_sumscore.analysis.comparison import (
    bootstrap_interval,
    compare_systems,
    compare_values,
    holm,
    permutation_p,
    system_from_rows,
)
from offline_sumscore.core.errors import InputError


def rows(scores: dict, *, settings=None, failed=(), judge="j1"):
    out = [
        {
            "id": f"{doc}-x",
            "doc_id": doc,
            "metric": "two-axis",
            "score": s,
            "alignment": s,
            "coverage": 1.0,
            "judge": {"name": judge, "identity": "abc", "dtype": "float32"},
            "settings": settings or {"prompt_version": "v1"},
            "claims": [],
            "questions": [],
            "coverage_verdicts": [],
        }
        for doc, s in scores.items()
    ]
    out += [
        {"id": f"{doc}-x", "doc_id": doc, "metric": "two-axis", "score": None, "error": {"stage": "support"}}
        for doc in failed
    ]
    return out


def test_a_known_shift_on_five_documents():
    b = [0.2, 0.4, 0.5, 0.6, 0.9]
    s = compare_values([x + 0.1 for x in b], b, resamples=2000)
    assert math.isclose(s["mean_diff"], 0.1) and math.isclose(s["ci_low"], 0.1) and math.isclose(s["ci_high"], 0.1)
    # Exact sign-flip test: of the 2^5 patterns only all-plus and all-minus reach |sum| = 0.5.
    assert s["p"] == pytest.approx(2 / 32) and (s["wins"], s["ties"], s["losses"]) == (5, 0, 0)


def test_ties_give_no_difference():
    s = compare_values([0.5, 0.7, 1.0], [0.5, 0.7, 1.0])
    assert s["mean_diff"] == 0 and s["p"] == 1.0 and (s["wins"], s["ties"], s["losses"]) == (0, 3, 0)


def test_one_document_proves_nothing():
    s = compare_values([0.9], [0.4])
    assert s["mean_diff"] == pytest.approx(0.5) and (s["ci_low"], s["ci_high"]) == pytest.approx((0.5, 0.5))
    assert s["p"] == 1.0  # both sign patterns reach |0.5|


def test_permutation_p_by_hand():
    # differences 1, 2, -1: |sum| = 2; of the 8 sign patterns, sums 2, 4, -2, 0, 0, 2, -4, -2: six reach 2.
    assert permutation_p([1, 2, -1]) == pytest.approx(6 / 8)


def test_bootstrap_is_reproducible_with_a_seed():
    diffs = [0.1, -0.3, 0.25, 0.0, 0.4, -0.05, 0.2]
    assert bootstrap_interval(diffs, seed=7) == bootstrap_interval(diffs, seed=7)
    assert bootstrap_interval(diffs, seed=7) != bootstrap_interval(diffs, seed=8)
    lo, hi = bootstrap_interval(diffs, seed=7)
    assert lo < sum(diffs) / len(diffs) < hi


def test_holm_by_hand():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_a_system_missing_documents_and_failed_rows_are_left_out_and_counted():
    a = system_from_rows("A", rows({"d1": 0.9, "d2": 0.8, "d3": 0.7, "d4": 0.6, "d5": 0.5}), by="doc_id")
    b = system_from_rows("B", rows({"d1": 0.5, "d2": 0.5, "d3": 0.5}, failed=["d4"]), by="doc_id")
    report = compare_systems([a, b], resamples=500)
    assert report["documents"] == 3
    stats = {s["name"]: s for s in report["systems"]}
    assert stats["A"]["not_in_every_system"] == 2 and stats["B"]["failed"] == 1
    score = report["pairs"][0]["fields"]["score"]
    assert score["mean_diff"] == pytest.approx(0.3)  # d1..d3 only: a failed row is never a zero
    assert score["p"] == pytest.approx(2 / 8) and score["verdict"] == "no difference"


def test_rows_under_different_settings_are_refused_unless_allowed_and_the_difference_is_named():
    a = system_from_rows("A", rows({"d1": 0.9, "d2": 0.8}), by="doc_id")
    b = system_from_rows("B", rows({"d1": 0.5, "d2": 0.5}, settings={"prompt_version": "v2"}), by="doc_id")
    with pytest.raises(InputError, match=r"settings.prompt_version: A='v1', B='v2'"):
        compare_systems([a, b])
    report = compare_systems([a, b], allow_mixed=True, resamples=200)
    assert report["settings_differ"] == {"settings.prompt_version": ["v1", "v2"]}


def test_three_systems_get_a_ranking_and_holm_adjusted_pairs():
    docs = [f"d{i}" for i in range(20)]
    a = system_from_rows("A", rows({d: 0.9 for d in docs}), by="doc_id")
    b = system_from_rows("B", rows({d: 0.5 + 0.01 * (i % 3) for i, d in enumerate(docs)}), by="doc_id")
    c = system_from_rows("C", rows({d: 0.5 + 0.01 * (i % 2) for i, d in enumerate(docs)}), by="doc_id")
    report = compare_systems([c, b, a], resamples=1000)
    assert report["ranking"] == ["A", "B", "C"]
    pairs = {(p["a"], p["b"]): p["fields"]["score"] for p in report["pairs"]}
    assert pairs[("C", "A")]["verdict"] == "B" and pairs[("B", "A")]["verdict"] == "B"
    assert all(s["p_holm"] >= s["p"] for s in pairs.values())
