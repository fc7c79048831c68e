"""SummaryScore (Ragas-style) end to end on a scripted judge."""

import json

import pytest

from offline_sumscore import SummaryScore, UsageError, summary_score
from offline_sumscore.scorers.reasons import EMPTY_SUMMARY_REASON
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


def test_empty_contexts_raise_value_error(scripted):
    with pytest.raises(ValueError, match='field "reference_contexts" is empty'):
        SummaryScore(engine=scripted).score(reference_contexts=["  ", ""], response="x")


@pytest.mark.parametrize("answers", ["questions", "likelihood"])
def test_scripted_empty_response_scores_0_with_a_reason_and_no_judge_call(scripted, answers):
    r = SummaryScore(engine=scripted, answers=answers).score(reference_contexts=["text"], response="\n")
    assert (r.score, r.qa, r.keyphrases, r.questions, r.answers) == (0, 0, [], [], [])
    assert r.empty_summary and r.reason == EMPTY_SUMMARY_REASON and r.soft_qa == 0.0
    assert r.stages == {} and scripted.requests == []
    assert r.settings["design.answers"] == answers  # as every row of the run records it
    assert summary_score(r.answers, "text", "\n").score == 0  # rescoring the row gives 0 again


def test_scripted_empty_response_has_the_shape_of_every_row(scripted):
    enqueue_all(scripted)
    full = SummaryScore(engine=scripted).score(SOURCE, SUMMARY)
    empty = SummaryScore(engine=scripted).score(SOURCE, "")
    assert set(empty.to_dict()) == set(full.to_dict())
    assert full.reason is None and not full.empty_summary and full.settings == empty.settings


def test_coeff_out_of_range_is_rejected():
    with pytest.raises(UsageError, match="coeff must be between 0 and 1. Given: 1.2"):
        SummaryScore(coeff=1.2)


def test_text_given_twice_is_rejected(scripted):
    with pytest.raises(UsageError, match="give the text once"):
        SummaryScore(engine=scripted).score(SOURCE, SUMMARY, reference_contexts=[SOURCE])


# -- a degenerate stage output fails the row at that stage, its raw output kept (issue 67) --------------------------
PROMPT_KINDS = ["people", "organisations", "locations", "dates", "times", "money amounts", "percentages"]


@pytest.mark.parametrize(
    "keyphrases, why",
    [
        (PROMPT_KINDS, "the prompt's own kinds"),
        (["people", "locations"], "the prompt's own kinds"),  # a subset of them
        (["Paris", "the Eiffel Tower"], "none of the 2 key phrases shares a word with the text"),  # "the" aside
    ],
)
def test_scripted_keyphrases_not_drawn_from_the_text_fail_the_stage_with_the_raw_output_kept(scripted, keyphrases, why):
    scripted.enqueue("keyphrases", {"keyphrases": keyphrases})
    (row,) = SummaryScore(engine=scripted).score_many([(SOURCE, SUMMARY)], on_error="return")
    assert row.to_dict()["score"] is None and row.error["cause"] == "keyphrases:degenerate"
    assert row.error["message"].startswith('stage "keyphrases" for id "0": ') and why in row.error["message"]
    assert json.loads(row.error["raw_output"]) == {"keyphrases": keyphrases}
    audit = row.stages["keyphrases"]
    assert json.loads(audit["raw_output"]) == {"keyphrases": keyphrases} and why in audit["error"]
    assert audit["error_kind"] == "degenerate"
    assert [q.stage for q in scripted.requests] == ["keyphrases"]  # nothing asked on them


def test_scripted_keyphrases_copied_from_the_text_or_none_pass(scripted):
    for keyphrases in (["Lindford", "£4 million", "Mill Street", "Tuesday"], ["300 people", "people"], []):
        source = SOURCE + " Some 300 people came." if "people" in keyphrases else SOURCE
        scripted.enqueue("keyphrases", {"keyphrases": keyphrases}).enqueue("ragas_questions", QUESTIONS)
        scripted.enqueue("ragas_answers", *ANSWERS)
        r = SummaryScore(engine=scripted).score(source, SUMMARY)
        assert r.keyphrases == keyphrases and r.settings["design.keyphrase_rule"]


def test_scripted_a_phrase_foreign_to_the_text_is_dropped_and_recorded(scripted):
    # The 1.5B judge's list for a text that names no people and no money: "people" and "money" among real phrases.
    source = "Heavy rain flooded Ostby. About 200 homes were evacuated, and schools will stay shut until Friday."
    said = ["people", "homes", "schools", "Friday", "money"]
    scripted.enqueue("keyphrases", {"keyphrases": said}).enqueue("ragas_questions", QUESTIONS)
    scripted.enqueue("ragas_answers", *ANSWERS)
    r = SummaryScore(engine=scripted).score(source, "It rained in Ostby.")
    assert r.keyphrases == ["homes", "schools", "Friday"]
    assert r.stages["keyphrases"]["dropped"] == [
        {"keyphrase": "people", "why": "no word of the text"},
        {"keyphrase": "money", "why": "no word of the text"},
    ]
    assert "Key phrases: homes; schools; Friday" in scripted.requests[1].messages[-1]["content"]


def test_scripted_numbered_statements_are_no_questions_and_fail_the_stage_by_name(scripted):
    numbered = {"questions": ["1. The council voted to build a library.", "2. It will cost 4 million pounds."]}
    scripted.enqueue("keyphrases", KEYPHRASES).enqueue("ragas_questions", json.dumps(numbered))
    (row,) = SummaryScore(engine=scripted).score_many([(SOURCE, SUMMARY)], on_error="return")
    assert row.error["cause"] == "ragas_questions:schema" and json.loads(row.error["raw_output"]) == numbered
    assert (
        "question 1 ('1. The council voted to build a library.') is not a closed question: it opens with a list "
        in (row.error["message"])
    )
    assert row.stages["ragas_questions"]["error"] == row.error["message"].split(": ", 1)[1]
    assert "ragas_answers" not in [q.stage for q in scripted.requests]
