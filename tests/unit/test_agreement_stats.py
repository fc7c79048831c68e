"""Agreement statistics on small inputs with answers worked out by hand (ties included), and the benchmark's reader."""

import json
import math

import pytest

from benchmarks.lib.agreement_stats import (
    balanced_accuracy,
    binary_agreement,
    cohens_kappa,
    correlate,
    kendall_tau_b,
    pearson,
    rank,
    roc_auc,
    spearman,
    summary_level,
)
from offline_sumscore.analysis.bootstrap import bootstrap_interval
from offline_sumscore.core.errors import InputError


def test_ranks_average_ties():
    assert list(rank([10, 20, 20, 30])) == [1, 2.5, 2.5, 4]
    assert list(rank([3, 1, 3, 3])) == [3, 1, 3, 3]


def test_pearson_perfect_and_undefined():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert pearson([1, 1, 1], [1, 2, 3]) is None  # a constant side: undefined, never NaN
    assert pearson([1], [2]) is None


def test_spearman_with_ties_by_hand():
    # ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4]: covariance 4.5, variances 4.5 and 5 -> 4.5 / sqrt(22.5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))


def test_kendall_tau_b_with_ties_by_hand():
    # 6 pairs: 5 concordant, 1 tied in x only -> 5 / sqrt(5 * 6)
    assert kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(5 / math.sqrt(30))
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert kendall_tau_b([2, 2, 2], [1, 2, 3]) is None


def test_missing_values_are_dropped_pairwise():
    assert pearson([1, None, 2, 3], [2, 5, 4, None]) == pytest.approx(1)  # only (1, 2) and (2, 4) are left


def test_summary_level_averages_within_documents_and_skips_a_document_with_one_system():
    x = [1, 2, 3, 1, 2, 3, 5]
    y = [1, 2, 3, 3, 2, 1, 9]
    docs = ["a", "a", "a", "b", "b", "b", "c"]  # c has one summary: no within-document correlation
    assert summary_level(spearman, x, y, docs) == pytest.approx(0.0)  # mean of +1 (a) and -1 (b)
    c = correlate(x, y, docs, resamples=200)
    assert c["summary"]["spearman"]["documents_defined"] == 2 and c["documents"] == 3 and c["n"] == 7


def test_bootstrap_resamples_documents_reproducibly_and_brackets_the_value():
    x = [i % 5 for i in range(40)]
    y = [v + (i % 3) * 0.5 for i, v in enumerate(x)]
    docs = [i // 4 for i in range(40)]
    ci = bootstrap_interval(lambda idx: pearson([x[i] for i in idx], [y[i] for i in idx]), docs, resamples=300, seed=1)
    assert ci == bootstrap_interval(
        lambda idx: pearson([x[i] for i in idx], [y[i] for i in idx]), docs, resamples=300, seed=1
    )
    assert ci[0] <= pearson(x, y) <= ci[1] and ci[0] < ci[1]
    assert bootstrap_interval(lambda idx: 1.0, ["one"] * 5) is None  # one document: nothing to resample


def test_balanced_accuracy_and_kappa_by_hand():
    assert balanced_accuracy([1, 1, 1, 0], [1, 1, 0, 0]) == pytest.approx((2 / 3 + 1) / 2)
    # observed 0.75; chance 0.5 * 0.25 + 0.5 * 0.75 = 0.5 -> kappa 0.5
    assert cohens_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert cohens_kappa([1, 1], [1, 1]) is None  # chance agreement is 1: undefined
    b = binary_agreement([True, False, None], [True, True, False])
    assert b["n"] == 2 and b["balanced_accuracy"] == pytest.approx(0.5)


def test_agreement_reader_names_the_malformed_line_and_field(tmp_path):
    from benchmarks.lib.agreement_items import read_items

    good = {"id": "s:d1:M1", "source": "A source.", "summary": "A summary.", "human": {"consistency": 5}, "judges": {}}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, id="s:d1:M2", human=[5])) + "\n")
    with pytest.raises(InputError, match=r'data.jsonl:2 \(id "s:d1:M2"\): field "human" must be a JSON object'):
        read_items(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(InputError, match=r"data.jsonl:2: is not valid JSON"):
        read_items(path)
    path.write_text(json.dumps(good) + "\n")
    (item,) = read_items(path)
    assert item["doc_id"] == "d1"


def test_stratified_document_pick_is_whole_documents_and_reproducible(tmp_path):
    from benchmarks.lib.agreement_items import pick_documents

    items = [
        {"id": f"s:d{d}:M{m}", "doc_id": f"d{d}", "human": {"consistency": d % 5 + m / 10}}
        for d in range(20)
        for m in range(3)
    ]
    a = pick_documents(items, "scores", 4, None, seed=3)
    assert a == pick_documents(items, "scores", 4, None, seed=3)
    docs = {i["doc_id"] for i in a}
    assert len(docs) == 4 and len(a) == 12  # whole documents, all their systems
    assert len(pick_documents(items, "scores", 4, 7, seed=3)) == 6  # --limit keeps whole documents


def test_roc_auc_by_hand_with_a_tie():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5) (0.9>0.1) (0.5=0.5 -> half) (0.5>0.1) -> 3.5 / 4
    assert roc_auc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx(3.5 / 4)
    assert roc_auc([1, 1], [0.2, 0.3]) is None  # one class only
