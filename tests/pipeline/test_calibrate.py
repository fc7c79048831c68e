"""Calibration: the threshold arithmetic without a model, `sumscore calibrate` and `score --calibration` on a
scripted judge, and the warning of a run whose verdicts all fall on one side."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from offline_sumscore.analysis.calibration import best_threshold, calibrate, one_sided
from offline_sumscore.cli import main
from offline_sumscore.scorers.stages.likelihood import LIKELIHOOD_RULE
from tests.conftest import write_jsonl

# Each row's one claim gets PMI = its support log-probability minus the baseline's (-5.0 for every baseline).
PMIS = [3.0, 2.5, 1.8, 1.2, 0.9, 0.5, -0.2, -1.0]
LABELS = ["consistent", "consistent", "consistent", "consistent", "inconsistent", "inconsistent", "inconsistent", "no"]


def test_the_best_threshold_separates_the_labels_and_sits_midway_between_rows():
    threshold, accuracy = best_threshold(PMIS, [x == "consistent" for x in LABELS])
    assert threshold == pytest.approx((1.2 + 0.9) / 2) and accuracy == 1.0
    assert best_threshold([1.0, 2.0], [True, True]) is None  # one class: nothing to choose
    noisy = calibrate([0.1, 0.4, 0.35, 0.8], [False, True, False, True], resamples=200)
    assert noisy.balanced_accuracy == 1.0 and noisy.threshold == pytest.approx(0.375)
    low, high = noisy.threshold_interval
    assert low <= noisy.threshold <= high


def test_the_bootstrap_interval_widens_when_rows_are_few():
    rng = np.random.default_rng(0)
    many = rng.normal(0, 1, 400)
    labels = list(many + rng.normal(0, 0.5, 400) > 0)
    wide, narrow = calibrate(list(many[:20]), labels[:20]), calibrate(list(many), labels)
    assert (
        wide.threshold_interval[1] - wide.threshold_interval[0]
        > narrow.threshold_interval[1] - narrow.threshold_interval[0]
    )


def test_a_run_with_its_claims_on_one_side_says_so_and_a_balanced_one_does_not():
    assert "100% of 40 claims are unsupported" in one_sided([False] * 40)
    assert "calibrate" in one_sided([True] * 39 + [False])
    assert one_sided([True] * 30 + [False] * 10) is None and one_sided([False] * 5) is None  # too few to say


def enqueue(scripted, pmis, supported_coverage=True):
    for pmi in pmis:
        scripted.enqueue("support", {"mean_logprob": pmi - 5.0, "tokens": 4})
        scripted.enqueue("coverage", {"mean_logprob": -1.0 if supported_coverage else -9.0, "tokens": 4})
        scripted.enqueue("baseline", {"mean_logprob": -5.0, "tokens": 4}, {"mean_logprob": -5.0, "tokens": 4})


def rows(n):
    return [{"id": f"r{k}", "source": f"Source {k} says a thing.", "summary": f"Row {k} says it."} for k in range(n)]


def test_calibrate_prints_the_threshold_and_writes_what_score_reads(tmp_path, use_scripted):
    enqueue(use_scripted, PMIS)
    labelled = write_jsonl(tmp_path / "labelled.jsonl", [dict(r, label=y) for r, y in zip(rows(8), LABELS)])
    out = tmp_path / "cal.json"
    result = CliRunner().invoke(main, ["calibrate", str(labelled), "-o", str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "threshold 1.050 nats per token" in result.output and "balanced accuracy 1.000" in result.output
    assert "--likelihood-threshold 1.05" in result.output and "8 rows (4 consistent)" in result.output
    saved = json.loads(out.read_text())
    assert saved["likelihood_threshold"] == 1.05 and saved["judge"]["identity"] == "scripted"

    enqueue(use_scripted, [1.1, 1.0])  # just above and just below the calibrated threshold
    scored = tmp_path / "scored.jsonl"
    args = ["score", str(write_jsonl(tmp_path / "in.jsonl", rows(2))), "-o", str(scored), "--quiet", "--no-cache"]
    args += ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1", "--verdicts", "likelihood"]
    result = CliRunner().invoke(main, [*args, "--calibration", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in scored.read_text().splitlines()]
    assert [r["claims"][0]["supported"] for r in got] == [True, False]
    assert got[0]["settings"]["likelihood_threshold"] == 1.05 and "run.one_sided" not in got[0]["settings"]
    both = CliRunner().invoke(main, [*args, "--calibration", str(out), "--likelihood-threshold", "2"])
    assert both.exit_code == 2 and "not both" in both.output


def test_a_calibration_made_under_another_likelihood_rule_is_named_as_such(tmp_path, use_scripted):
    # A calibration from an older version read numbers its rule made: the threshold may not fit this version's.
    enqueue(use_scripted, PMIS)
    labelled = write_jsonl(tmp_path / "labelled.jsonl", [dict(r, label=y) for r, y in zip(rows(8), LABELS)])
    out = tmp_path / "cal.json"
    CliRunner().invoke(main, ["calibrate", str(labelled), "-o", str(out), "--quiet"], catch_exceptions=False)
    args = ["score", str(write_jsonl(tmp_path / "in.jsonl", rows(2))), "-o", str(tmp_path / "o.jsonl"), "--quiet"]
    args += ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1", "--verdicts", "likelihood"]
    args += ["--no-cache", "--calibration", str(out)]
    enqueue(use_scripted, [1.1, 1.0])
    same = CliRunner().invoke(main, args, catch_exceptions=False)
    assert same.exit_code == 0 and "another likelihood rule" not in same.output
    saved = json.loads(out.read_text())
    assert saved["likelihood_rule"] == LIKELIHOOD_RULE
    out.write_text(json.dumps(dict(saved, likelihood_rule="mean PMI")))  # as an older version would have judged
    enqueue(use_scripted, [1.1, 1.0])
    older = CliRunner().invoke(main, args, catch_exceptions=False)
    assert older.exit_code == 0 and older.output.count("made under another likelihood rule ('mean PMI';") == 1


def test_calibrate_names_the_row_and_field_of_a_bad_label(tmp_path, use_scripted):
    labelled = write_jsonl(tmp_path / "labelled.jsonl", [dict(r, label="maybe") for r in rows(2)])
    result = CliRunner().invoke(main, ["calibrate", str(labelled), "--quiet"])
    assert result.exit_code == 2 and "labelled.jsonl:1: field \"label\" is 'maybe'" in result.output


def test_a_scoring_run_whose_claims_all_fall_on_one_side_warns_once(tmp_path, use_scripted):
    enqueue(use_scripted, [-1.0] * 24)  # every claim far below the 2.0 default: all unsupported
    args = ["score", str(write_jsonl(tmp_path / "in.jsonl", rows(24))), "-o", str(tmp_path / "o.jsonl"), "--quiet"]
    args += ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1", "--verdicts", "likelihood"]
    result = CliRunner().invoke(main, [*args, "--no-cache"], catch_exceptions=False)
    assert result.output.count("100% of 24 claims are unsupported") == 1 and "sumscore calibrate" in result.output
    written = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert all("100% of 24 claims are unsupported" in r["settings"]["run.one_sided"] for r in written)
    report = tmp_path / "r.html"
    CliRunner().invoke(main, ["report", str(tmp_path / "o.jsonl"), "-o", str(report)], catch_exceptions=False)
    assert "id=one-sided" in report.read_text()
