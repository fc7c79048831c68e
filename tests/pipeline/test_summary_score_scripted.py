"""SummaryScore (Ragas-style) end to end on a scripted judge."""

import json

import pytest

from offline_sumscore import SummaryScore, UsageError, summary_score
from tests.conftest import SOURCE, SUMMARY

KEYPHRASES = {"keyphrases": ["Lindford", "Mill Street", "4 million pounds", "March"]}
QUESTIONS = {
    "questions": ["Is the library on Mill Street?", "Does it cost 4 million pounds?", "Does work start in March?"]
}
ANSWERS = [{"answer": "1"}, {"answer": "1"}, {"answer": "0"}]  # one reply per question


def enqueue_all(scripted):
    scripted.enqueue("keyphrases", KEYPHRASES).enqueue("ragas_questions", QUESTIONS).enqueue("ragas_answers", *ANSWERS)


def test_ragas_argument_names_and_the_formula(scripted):
    enqueue_all(scripted)
    contexts = SOURCE.split(". ")
    r = SummaryScore(engine=scripted, coeff=0.3).score(reference_contexts=contexts, response=SUMMARY)
    text = "\n".join(contexts)
    assert r.qa == pytest.approx(2 / 3)
    assert r.conciseness == pytest.approx(1 - len(SUMMARY) / (len(text) + 1e-10))
    assert r.score == pytest.approx(r.qa * 0.7 + r.conciseness * 0.3) and r.value == r.score
    assert r.keyphrases == KEYPHRASES["keyphrases"] and r.answers == ["1", "1", "0"]
    assert [q.stage for q in scripted.requests] == ["keyphrases", "ragas_questions"] + ["ragas_answers"] * 3
    assert r.soft_qa is None and r.answer_p_yes == [None] * 3


def test_questions_are_drawn_from_text_and_keyphrases_and_answered_without_the_text(scripted):
    enqueue_all(scripted)
    SummaryScore(engine=scripted).score(SOURCE, SUMMARY)
    questions_req, answer_reqs = scripted.requests[1], scripted.requests[2:]
    assert "Mill Street; 4 million pounds" in json.dumps(questions_req.messages)
    assert len(answer_reqs) == 3
    for req, question in zip(answer_reqs, QUESTIONS["questions"]):
        assert "Construction will begin" not in json.dumps(req.messages) and question in json.dumps(req.messages)
        assert req.schema.model_json_schema()["properties"]["answer"]["enum"] == ["1", "0"]


def test_no_length_penalty_scores_qa_alone(scripted):
    enqueue_all(scripted)
    r = SummaryScore(engine=scripted, length_penalty=False).score(SOURCE, SUMMARY)
    assert r.score == pytest.approx(2 / 3) and r.conciseness is None


def test_rescoring_saved_answers_with_another_coeff(scripted):
    enqueue_all(scripted)
    row = SummaryScore(engine=scripted).score(SOURCE, SUMMARY).to_dict()
    again = summary_score(row["answers"], SOURCE, SUMMARY, coeff=0.5)
    assert again.score == pytest.approx(row["score"])
    assert summary_score(row["answers"], SOURCE, SUMMARY, coeff=0.0).score == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reference_contexts": ["  ", ""], "response": "x"}, 'field "reference_contexts" is empty'),
        ({"reference_contexts": ["text"], "response": "\n"}, 'field "response" is empty'),
    ],
)
def test_empty_contexts_or_response_raise_value_error(scripted, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SummaryScore(engine=scripted).score(**kwargs)


def test_coeff_out_of_range_is_rejected():
    with pytest.raises(UsageError, match="coeff must be between 0 and 1. Given: 1.2"):
        SummaryScore(coeff=1.2)


def test_text_given_twice_is_rejected(scripted):
    with pytest.raises(UsageError, match="give the text once"):
        SummaryScore(engine=scripted).score(SOURCE, SUMMARY, reference_contexts=[SOURCE])
