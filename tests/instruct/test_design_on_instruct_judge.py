"""The demo's three rows (a faithful summary, a wrong figure and a wrong outcome, a thin summary) through both metrics
on the instruct judge, the two-axis score's rows from the CLI's run without --model (conftest's default_cli_demo):
every drawn question closed, the planted '27' named against the source's 17, the faithful row passing and the thin one
not, verdicts with reasons, the Ragas stages' keyphrases, questions and answers."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from offline_sumscore import SummaryScore
from offline_sumscore.scorers.stages.questions import is_closed_question

pytestmark = pytest.mark.model
DEMO = [
    json.loads(line)
    for line in (resources.files("offline_sumscore") / "examples" / "demo.jsonl").read_text().splitlines()
]


@pytest.fixture(scope="module")
def two_axis(default_cli_demo):
    return default_cli_demo[0]


@pytest.fixture(scope="module")
def summary_score(instruct_judge):
    scorer = SummaryScore(instruct_judge, max_questions=3, max_keyphrases=6, max_text_chars=100)
    rows = scorer.score_many([(d["source"], d["summary"]) for d in DEMO])
    return {d["id"]: r.to_dict() for d, r in zip(DEMO, rows)}


def test_every_drawn_question_is_closed(two_axis, summary_score):
    drawn = [q for row in [*two_axis.values(), *summary_score.values()] for q in row["questions"]]
    assert len(drawn) >= 6
    assert [q for q in drawn if not is_closed_question(q)] == []


def test_the_planted_age_is_named_against_the_sources(two_axis):
    row = two_axis["wrong-fact"]
    named = [(c, f) for c in row["claims"] for f in c.get("figures") or [] if f["figure"] == "27"]
    assert named, row["claims"]
    claim, figure = named[0]
    assert not claim["supported"]
    assert figure["source_says"].startswith("17")
    assert "27" in row["reason"] and row["score"] < 0.5


def test_the_faithful_row_passes_and_the_thin_one_does_not(two_axis):
    faithful, thin = two_axis["faithful"], two_axis["thin"]
    assert faithful["alignment"] == 1.0 and faithful["coverage"] > 0.5
    assert thin["coverage"] < faithful["coverage"] and thin["score"] < faithful["score"]
    assert faithful["score"] > two_axis["wrong-fact"]["score"]


def test_no_evidence_accuses_the_faithful_summary(two_axis):
    for claim in two_axis["faithful"]["claims"]:
        assert claim["figures"] == [] and not claim.get("conflict"), claim
    assert two_axis["faithful"]["unclaimed_figures"] == []


def test_every_verdict_carries_a_reason_that_agrees_with_it(two_axis):
    for row in two_axis.values():
        verdicts = [
            (c["supported"], c["p_supported"], c.get("reason")) for c in row["claims"] if "overruled_by" not in c
        ]
        verdicts += [(v["answered"], v["p_answered"], v.get("reason")) for v in row["coverage_verdicts"]]
        assert verdicts
        for said, p, reason in verdicts:
            assert reason and len(reason.split()) >= 3, row["id"]
            assert said == (p >= 0.5), (row["id"], said, p)


def test_the_ragas_stages_draw_keyphrases_questions_and_answers(summary_score):
    for row in summary_score.values():
        assert 1 <= len(row["keyphrases"]) <= 6
        assert 1 <= len(row["questions"]) <= 3
        assert len(row["answers"]) == len(row["questions"])
        assert set(row["answers"]) <= {"0", "1"}
        assert row["qa"] == pytest.approx(row["answers"].count("1") / len(row["answers"]))
