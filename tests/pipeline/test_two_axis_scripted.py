"""SummarizationScorer end to end on a scripted judge (ScriptedEngine: fixed JSON replies, every request recorded)."""
import asyncio
import json

import pytest

from offline_sumscore import FailedRow, JudgeOutputError, SummarizationScorer, UsageError
from tests.conftest import SOURCE, SUMMARY

CLAIMS = {"claims": [{"claim": "Lindford will build a library.", "supported": True, "reason": "stated"},
                     {"claim": "It is on Mill Street.", "supported": True, "reason": "stated"},
                     {"claim": "It costs 5 million pounds.", "supported": False, "reason": "source says 4"}]}
QUESTIONS = {"questions": ["Did the council vote to build a library?", "Will construction begin in March?"]}
COVERAGE = [{"answered": True, "reason": "says so"}, {"answered": False, "reason": "no date given"}]  # per question


def scorer_with(scripted, **kw):
    return SummarizationScorer(engine=scripted, **kw)


def test_score_arithmetic_reason_and_every_verdict_kept(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    r = scorer_with(scripted).score(SOURCE, SUMMARY)
    assert (r.score, r.alignment, r.coverage) == (0.5, pytest.approx(2 / 3), 0.5)
    assert r.limiting_axis == "coverage" and r.passed
    assert r.reason.startswith("The score is 0.5 because coverage (0.5) set it")
    assert "Will construction begin in March?" in r.reason
    assert [c["supported"] for c in r.claims] == [True, True, False]
    assert r.questions == QUESTIONS["questions"] and r.questions_from == "judge"
    assert r.coverage_verdicts[1] == {"answered": False, "reason": "no date given", "p_answered": None}
    assert set(r.stages) == {"claims", "questions", "coverage.0", "coverage.1"}
    assert all({"prompt", "raw_output", "tokens_in", "tokens_out", "seconds"} <= set(s) for s in r.stages.values())
    assert json.loads(r.stages["coverage.1"]["raw_output"]) == COVERAGE[1]
    assert r.soft_alignment is None and r.soft_coverage is None  # a scripted judge has no distribution


def test_reason_names_alignment_and_the_unsupported_claim_when_alignment_sets_the_score(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS)
    scripted.enqueue("coverage", {"answered": True, "reason": "a"}, {"answered": True, "reason": "b"})
    r = scorer_with(scripted, scale=10).score(SOURCE, SUMMARY)
    assert r.score == 6.67
    assert r.reason.startswith("The score is 6.67 because alignment (0.67) set it")
    assert '"It costs 5 million pounds."' in r.reason


def test_coverage_stage_never_sees_the_source(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    scorer_with(scripted).score(SOURCE, SUMMARY)
    coverage = [q for q in scripted.requests if q.stage == "coverage"]
    assert len(coverage) == 2  # one request per question
    for req, question in zip(coverage, QUESTIONS["questions"]):
        rendered = json.dumps(req.messages)
        assert "Construction will begin in March and cost 4 million pounds" not in rendered
        assert SUMMARY in rendered and question in rendered


def test_user_supplied_questions_skip_generation_and_are_capped_by_position(scripted):
    questions = ["Q1?", "Q2?", "Q3?"]
    scripted.enqueue("claims", CLAIMS).enqueue("coverage", *[{"answered": True, "reason": "r"}] * 2)
    r = scorer_with(scripted, max_questions=2).score(SOURCE, SUMMARY, questions=questions)
    assert [q.stage for q in scripted.requests] == ["claims", "coverage", "coverage"]
    assert "Q3?" not in json.dumps([q.messages for q in scripted.requests])
    assert r.coverage == 1.0 and r.questions_from == "user" and r.questions == questions


def test_empty_user_questions_score_zero_with_a_reason(scripted):
    scripted.enqueue("claims", CLAIMS)
    r = scorer_with(scripted).score(SOURCE, SUMMARY, questions=[])
    assert r.score == 0.0 and "no questions" in r.reason


def test_strict_mode_and_threshold(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    r = scorer_with(scripted, strict_mode=True).score(SOURCE, SUMMARY)
    assert (r.alignment, r.coverage, r.score, r.passed) == (0.0, 0.0, 0.0, False)
    assert "strict mode" in r.reason


def test_include_reason_off_asks_for_no_reasons_and_gives_none(scripted):
    scripted.enqueue("claims", {"claims": [{"claim": "c", "supported": True}]})
    scripted.enqueue("questions", {"questions": ["q?"]}).enqueue("coverage", {"answered": True})
    r = scorer_with(scripted, include_reason=False).score(SOURCE, SUMMARY)
    assert r.reason is None and r.score == 1.0
    for req in scripted.requests:
        assert "reason" not in json.dumps(req.schema.model_json_schema())


def test_score_many_sends_each_wave_for_all_samples_in_one_engine_call(scripted):
    for _ in range(3):
        scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    results = scorer_with(scripted).score_many([(SOURCE, SUMMARY)] * 3)
    assert [r.score for r in results] == [0.5] * 3
    assert scripted.calls == [6, 6]  # wave 1: claims + questions of 3 samples; wave 2: 2 questions x 3 samples


def test_failed_stage_raises_with_raw_output_or_is_recorded_as_failed_row(scripted):
    scripted.enqueue("claims", '{"claims": [{"claim": "x", "supp')  # truncated: what a token cap leaves
    scripted.enqueue("questions", QUESTIONS)
    with pytest.raises(JudgeOutputError, match='stage "claims" for id "0"') as info:
        scorer_with(scripted).score(SOURCE, SUMMARY)
    assert info.value.raw_output.startswith('{"claims"')

    scripted.enqueue("claims", "not json", CLAIMS).enqueue("questions", QUESTIONS, QUESTIONS)
    scripted.enqueue("coverage", *COVERAGE)
    rows = scorer_with(scripted).score_many([{"id": "bad", "source": SOURCE, "summary": SUMMARY},
                                             {"id": "good", "source": SOURCE, "summary": SUMMARY}], on_error="return")
    assert isinstance(rows[0], FailedRow) and rows[0].error["stage"] == "claims"
    assert rows[0].error["raw_output"] == "not json" and rows[0].to_dict()["score"] is None
    assert rows[1].score == 0.5  # the other row goes on


def test_ascore_gives_the_same_result(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    r = asyncio.run(scorer_with(scripted).ascore(SOURCE, SUMMARY))
    assert r.score == 0.5


@pytest.mark.parametrize("kw, message", [({"max_questions": 0}, "max_questions must be an integer >= 1. Given: 0"),
                                         ({"scale": -1}, "scale must be > 0. Given: -1"),
                                         ({"threshold": 2}, "threshold must be between 0 and 1. Given: 2")])
def test_bad_settings_are_usage_errors(kw, message):
    with pytest.raises(UsageError, match=message):
        SummarizationScorer(**kw)


def test_empty_summary_is_an_input_error_naming_the_field(scripted):
    with pytest.raises(ValueError, match='field "summary" is empty or whitespace-only'):
        scorer_with(scripted).score(SOURCE, "  ")


def test_rescoring_a_saved_row_reproduces_its_score(scripted):
    from offline_sumscore import two_axis_score
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("coverage", *COVERAGE)
    row = json.loads(json.dumps(scorer_with(scripted).score(SOURCE, SUMMARY).to_dict()))
    again = two_axis_score(row["claims"], row["questions"], row["coverage_verdicts"])
    assert (again.score, again.alignment, again.coverage) == (row["score"], row["alignment"], row["coverage"])
    assert two_axis_score(row["claims"], row["questions"], row["coverage_verdicts"], scale=100).score == 50.0
