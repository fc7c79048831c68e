"""Replies are read by their requests' identities (scorers/waves.py), never by their places in the wave: a wave whose
requests reach the judge in another order scores the same, and a reply that is missing or answers a request the
wave never asked fails the row, naming it. The judge here is scripted by content (each reply is chosen from the
request's own text), so that an order mix-up would show as verdicts on the wrong claims."""

from __future__ import annotations

import json

import pytest

from offline_sumscore import JudgeOutputError, SummarizationScorer, SummaryScore
from offline_sumscore.engine.scripted import ScriptedEngine

SOURCE = "The library opens in March. It cost 4 million pounds. It has a reading room."
SUMMARY = "The library opens in March, cost 4 million pounds and has a pool."
CLAIMS = ["The library opens in March.", "The library cost 4 million pounds.", "The library has a pool."]
QUESTIONS = ["Does the library open in March?", "Does the library have a reading room?"]


class ContentJudge(ScriptedEngine):
    """Answers each request from its own text: the pool claim is not supported and the reading-room question is not
    answered by the summary; every other claim and question is."""

    def run(self, requests):
        results = []
        for request in requests:
            text = "\n".join(m["content"] for m in request.messages)
            known = CLAIMS[2] not in text and QUESTIONS[1] not in text
            reply = {
                "claims": json.dumps({"claims": CLAIMS}),
                "questions": json.dumps({"questions": QUESTIONS}),
                "keyphrases": json.dumps({"keyphrases": ["March", "4 million"]}),
                "ragas_questions": json.dumps({"questions": QUESTIONS}),
                "ragas_answers": json.dumps({"answer": "1" if known else "0"}),
            }.get(request.stage, "Yes" if known else "No\nReason: the text does not say so")
            self.enqueue(request.stage, reply)
            results += super().run([request])
        return results


def reordered(plan, order):
    """The plan, each wave sent in another order (order(wave) -> the wave as the engine gets it), its replies handed
    back in the order they came."""
    wave = next(plan)
    while True:
        try:
            wave = plan.send((yield order(wave)))
        except StopIteration as stop:
            return stop.value


def scored(scorer_class, order=None, **kw):
    scorer = scorer_class(engine=ContentJudge(), **kw)
    if order is not None:
        plan = scorer.plan
        scorer.plan = lambda sample: reordered(plan(sample), order)
    return scorer.score(SOURCE, SUMMARY)


def test_a_wave_sent_in_reverse_scores_as_the_wave_in_order():
    expected = scored(SummarizationScorer)
    assert [c["supported"] for c in expected.claims] == [True, True, False]  # the judge tells the pool apart
    assert [v["answered"] for v in expected.coverage_verdicts] == [True, False]
    for order in (lambda wave: wave[::-1], lambda wave: wave[1::2] + wave[::2]):
        got = scored(SummarizationScorer, order)
        assert [c["claim"] for c in got.claims] == CLAIMS
        assert [c["supported"] for c in got.claims] == [True, True, False]
        assert got.coverage_verdicts == expected.coverage_verdicts
        assert (got.score, got.alignment, got.coverage) == (expected.score, expected.alignment, expected.coverage)


def test_summary_score_reads_its_answers_by_identity_too():
    expected = scored(SummaryScore)
    got = scored(SummaryScore, lambda wave: wave[::-1])
    assert expected.answers == ["1", "0"] and got.answers == expected.answers and got.score == expected.score


def test_a_reply_missing_from_a_wave_fails_the_row_naming_the_request():
    with pytest.raises(JudgeOutputError, match=r"replies do not match their requests: 1 requests have no reply"):
        scored(SummarizationScorer, lambda wave: wave[:-1])
