"""SummarizationScorer end to end on a scripted judge (ScriptedEngine: fixed replies, every request recorded).

The scripted judge is a "brought" judge, so "auto" gives atomic claims, questions and yes-no verdicts; tests of the
embedded judge's design (sentences, key sentences, likelihood verdicts) set it explicitly.
"""

import asyncio
import json
import math

import pytest

from offline_sumscore import FailedRow, JudgeOutputError, SummarizationScorer, UsageError, two_axis_score
from offline_sumscore.engine.scripted import ScriptedEngine
from offline_sumscore.scorers.reasons import EMPTY_SUMMARY_REASON
from offline_sumscore.scorers.stages.verdict import LIKELIHOOD_INSTRUCTION, ONE_SENTENCE_SUMMARY_INSTRUCTION
from tests.conftest import CLAIMS, COVERAGE, QUESTIONS, SOURCE, SUMMARY, SUPPORT, enqueue_two_axis


def scorer_with(scripted, **kw):
    return SummarizationScorer(engine=scripted, **kw)


def test_score_arithmetic_reason_and_every_verdict_kept(scripted):
    r = scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY)
    assert (r.score, r.alignment, r.coverage) == (0.5, pytest.approx(2 / 3), 0.5)
    assert r.limiting_axis == "coverage" and r.passed
    assert r.reason.startswith("The score is 0.5 because coverage (0.5) set it")
    assert "Will construction begin in March?" in r.reason
    assert [c["claim"] for c in r.claims] == CLAIMS["claims"]
    assert [c["supported"] for c in r.claims] == [True, True, False]
    assert r.claims[2]["reason"] == "the source says 4 million"
    assert r.questions == QUESTIONS["questions"] and r.coverage_from == "questions"
    assert r.coverage_verdicts[1] == {"answered": False, "reason": "no date given", "p_answered": None}
    assert set(r.stages) == {"claims", "questions", "support.0", "support.1", "support.2", "coverage.0", "coverage.1"}
    assert all({"prompt", "raw_output", "tokens_in", "tokens_out", "seconds"} <= set(s) for s in r.stages.values())
    assert r.stages["coverage.1"]["raw_output"] == COVERAGE[1]
    assert r.soft_alignment is None and r.soft_coverage is None  # a scripted judge has no distribution
    assert r.settings["design.claims"] == "atomic" and r.settings["design.verdicts"] == "yes-no"
    assert r.settings["flavor"] == "mastra"


def test_each_claim_is_judged_alone_against_the_source_and_the_claims_stage_sees_only_the_summary(scripted):
    scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY)
    claims = [q for q in scripted.requests if q.stage == "claims"]
    assert len(claims) == 1 and "Construction will begin" not in json.dumps(claims[0].messages)
    support = [q for q in scripted.requests if q.stage == "support"]
    assert len(support) == 3
    for req, claim in zip(support, CLAIMS["claims"]):
        text = req.messages[-1]["content"]
        assert text.startswith("<article>\n" + SOURCE) and claim in text
        assert sum(c in text for c in CLAIMS["claims"]) == 1  # one claim per request


def test_reason_names_alignment_and_the_unsupported_claim_when_alignment_sets_the_score(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("support", *SUPPORT)
    scripted.enqueue("coverage", "Yes", "Yes")
    r = scorer_with(scripted, scale=10).score(SOURCE, SUMMARY)
    assert r.score == 6.67
    assert r.reason.startswith("The score is 6.67 because alignment (0.67) set it")
    assert '"It costs 5 million pounds."' in r.reason


def test_coverage_stage_never_sees_the_source(scripted):
    scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY)
    coverage = [q for q in scripted.requests if q.stage == "coverage"]
    assert len(coverage) == 2  # one request per question
    for req, question in zip(coverage, QUESTIONS["questions"]):
        rendered = json.dumps(req.messages)
        assert "Construction will begin in March and cost 4 million pounds" not in rendered
        assert SUMMARY in rendered and question in rendered


def test_zero_claims_score_zero_with_a_reason_that_says_so(scripted):
    scripted.enqueue("claims", {"claims": []}).enqueue("questions", QUESTIONS).enqueue("coverage", "Yes", "Yes")
    r = scorer_with(scripted).score(SOURCE, SUMMARY)
    assert (r.score, r.alignment, r.coverage, r.claims) == (0.0, 0.0, 1.0, [])
    assert "makes no claim" in r.reason
    assert not [q for q in scripted.requests if q.stage == "support"]


def test_a_claims_list_that_reaches_the_bound_is_asked_again_in_halves_never_cut(scripted):
    summary = "Lindford will build a library. It is on Mill Street. It will cost 4 million pounds."
    scripted.enqueue("claims", {"claims": ["a", "b", "c"]})  # the bound: the judge may have had more to say
    scripted.enqueue(
        "claims",
        {"claims": ["Lindford will build a library.", "The library is on Mill Street."]},
        {"claims": ["It will cost 4 million pounds."]},
    )
    scripted.enqueue("support", "Yes", "Yes", "Yes").enqueue("coverage", "Yes")
    r = scorer_with(scripted, max_claims=3).score(SOURCE, summary, questions=["Q?"])
    halves = [q.messages[-1]["content"] for q in scripted.requests if q.stage == "claims"][1:]
    assert "It is on Mill Street." in halves[0] and "4 million" not in halves[0]  # whole sentences, in two halves
    assert "It will cost 4 million pounds." in halves[1] and "Mill Street" not in halves[1]
    assert [c["claim"] for c in r.claims] == [
        "Lindford will build a library.",
        "The library is on Mill Street.",
        "It will cost 4 million pounds.",
    ]


def test_one_sentence_whose_claims_reach_the_bound_fails_loudly(scripted):
    scripted.enqueue("claims", {"claims": ["a", "b"]})
    with pytest.raises(JudgeOutputError, match="listed 2 claims, the bound, for one sentence") as info:
        scorer_with(scripted, max_claims=2).score(SOURCE, "One sentence only.", questions=["Q?"])
    assert info.value.kind == "bound" and info.value.raw_output == '{"claims": ["a", "b"]}'


def test_a_claims_list_that_repeats_itself_to_the_bound_is_read_as_its_distinct_claims(scripted):
    """A scripted judge caught in a loop: two claims written over and over to the safety bound. The row scores on
    the two, each counted once, and the stage's audit says how many repeats were dropped."""
    scripted.enqueue("claims", {"claims": ["Lindford will build a library.", "It is on Mill Street."] * 3})
    scripted.enqueue("support", "Yes", "No").enqueue("coverage", "Yes")
    r = scorer_with(scripted, max_claims=6).score(SOURCE, "One sentence only.", questions=["Q?"])
    assert [c["claim"] for c in r.claims] == ["Lindford will build a library.", "It is on Mill Street."]
    assert r.alignment == 0.5 and r.stages["claims"]["repeats_dropped"] == 4


def test_duplicate_and_generic_questions_do_not_count_and_are_kept_in_the_row(scripted):
    drawn = [
        "Did the council vote to build a library?",
        "Is the most important fact mentioned?",
        "Did the council vote to build a library?",
        "Will construction begin in March?",
    ]
    scripted.enqueue("claims", CLAIMS).enqueue("questions", {"questions": drawn}).enqueue("support", *SUPPORT)
    scripted.enqueue("coverage", *COVERAGE)
    r = scorer_with(scripted).score(SOURCE, SUMMARY)
    assert r.questions == QUESTIONS["questions"] and r.coverage == 0.5
    assert [d["question"] for d in r.dropped_questions] == drawn[1:3]
    assert [d["why"].split(":")[0] for d in r.dropped_questions] == ["generic", "duplicate of question 1"]


def test_user_supplied_questions_skip_generation_and_are_capped_by_position(scripted):
    questions = ["Q1?", "Q2?", "Q3?"]
    scripted.enqueue("claims", CLAIMS).enqueue("support", *SUPPORT).enqueue("coverage", "Yes", "Yes")
    r = scorer_with(scripted, max_questions=2).score(SOURCE, SUMMARY, questions=questions)
    assert [q.stage for q in scripted.requests] == ["claims"] + ["support"] * 3 + ["coverage"] * 2
    assert "Q3?" not in json.dumps([q.messages for q in scripted.requests])
    assert r.coverage == 1.0 and r.coverage_from == "user_questions" and r.questions == questions


def test_key_facts_are_checked_against_the_summary_as_statements(scripted):
    facts = ["Lindford will build a library.", "Construction begins in March."]
    scripted.enqueue("claims", CLAIMS).enqueue("support", *SUPPORT).enqueue("coverage", "Yes", "No")
    r = scorer_with(scripted).score(SOURCE, SUMMARY, key_facts=facts)
    coverage = [q for q in scripted.requests if q.stage == "coverage"]
    assert all("<statement>" in q.messages[-1]["content"] and SUMMARY in q.messages[-1]["content"] for q in coverage)
    assert r.coverage_from == "key_facts" and r.questions == facts and r.coverage == 0.5
    assert "does not cover 1 of 2 key facts" in r.reason


def test_empty_user_questions_mean_generate_them_as_in_deepeval(scripted):
    r = scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY, questions=[])
    assert r.coverage_from == "questions" and r.score == 0.5


def test_sentences_mode_judges_each_summary_sentence_and_asks_for_no_claims(scripted):
    summary = "Lindford will build a library. It will cost 5 million pounds."
    scripted.enqueue("support", "Yes", "No").enqueue("coverage", "Yes")
    r = scorer_with(scripted, claims="sentences").score(SOURCE, summary, questions=["Q?"])
    assert [q.stage for q in scripted.requests] == ["support", "support", "coverage"]
    assert [(c["claim"], c["supported"]) for c in r.claims] == [
        ("Lindford will build a library.", True),
        ("It will cost 5 million pounds.", False),
    ]
    assert r.settings["design.claims"] == "sentences"


def test_a_list_summary_is_judged_item_by_item_without_its_heading_or_markers(scripted):
    summary = "**Key points:**\n- Lindford will build a library\n- It will cost 5 million pounds on u.s. terms."
    scripted.enqueue("support", "Yes", "No").enqueue("coverage", "Yes")
    r = scorer_with(scripted, claims="sentences").score(SOURCE, summary, questions=["Q?"])
    assert [c["claim"] for c in r.claims] == [
        "Lindford will build a library",
        "It will cost 5 million pounds on u.s. terms.",
    ]
    support = [q.messages for q in scripted.requests if q.stage == "support"]
    assert len(support) == 2 and "Key points" not in json.dumps(support)  # the whole summary is only in coverage


def test_key_sentences_mode_checks_the_sources_lead_sentences_against_the_summary(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("support", *SUPPORT).enqueue("coverage", "Yes", "No")
    r = scorer_with(scripted, coverage="key_sentences").score(SOURCE, SUMMARY)
    assert r.coverage_from == "key_sentences"
    assert r.questions == [
        "The city council of Lindford voted on Tuesday to build a new public library on Mill Street.",
        "Construction will begin in March and cost 4 million pounds.",
    ]
    assert not [q for q in scripted.requests if q.stage == "questions"]


def lik(mean_logprob, tokens=5):
    return {"mean_logprob": mean_logprob, "tokens": tokens}


def test_likelihood_verdicts_are_the_gain_over_the_baseline_against_the_threshold(scripted):
    summary = "Lindford will build a library. It will cost 5 million pounds."
    # support (text, then baseline) per sentence, then coverage (text, baseline) per key fact
    scripted.enqueue("support", lik(-1.0), lik(-2.0)).enqueue("baseline", lik(-4.0), lik(-3.0), lik(-5.0))
    scripted.enqueue("coverage", lik(-2.0))
    r = scorer_with(scripted, claims="sentences", verdicts="likelihood").score(SOURCE, summary, key_facts=["F."])
    pairs = [(q.stage, q.continuation) for q in scripted.requests]
    assert pairs == [
        ("support", "Lindford will build a library."),
        ("baseline", "Lindford will build a library."),
        ("support", "It will cost 5 million pounds."),
        ("baseline", "It will cost 5 million pounds."),
        ("coverage", "F."),
        ("baseline", "F."),
    ]
    base = [q for q in scripted.requests if q.stage == "baseline"][0]
    assert "<article>\n\n</article>" in base.messages[-1]["content"]  # the statement without any text
    first, second = r.claims
    assert (first["pmi"], first["supported"]) == (3.0, True) and first["p_supported"] == pytest.approx(
        1 / (1 + math.exp(-1.0))
    )
    assert (second["pmi"], second["supported"]) == (1.0, False)  # below the 2.0 nats threshold
    assert r.coverage_verdicts[0]["pmi"] == 3.0 and r.coverage_verdicts[0]["answered"]
    assert r.settings["design.likelihood_threshold"] == 2.0 and r.score == 0.5


def test_a_one_sentence_summary_is_asked_as_a_summary_and_a_longer_ones_sentences_as_quotes(scripted):
    # What the judge is asked after the article decides the likelihood read. A summary of one sentence is the whole
    # article in a line: its claim (and that claim's baseline) is asked as the judge's one-sentence summary. The
    # sentences of a longer summary, and every coverage statement (checked against the summary), stay quotes.
    def instructions(stage: str) -> list[str]:
        return [q.messages[-1]["content"].rsplit("\n", 1)[-1] for q in scripted.requests if q.stage == stage]

    scorer = scorer_with(scripted, claims="sentences", verdicts="likelihood")
    scripted.enqueue("support", lik(-1.0)).enqueue("baseline", lik(-4.0), lik(-4.0)).enqueue("coverage", lik(-1.0))
    one = scorer.score(SOURCE, "Lindford will build a library.", key_facts=["F."])
    assert instructions("support") == [ONE_SENTENCE_SUMMARY_INSTRUCTION]
    assert instructions("baseline") == [ONE_SENTENCE_SUMMARY_INSTRUCTION, LIKELIHOOD_INSTRUCTION]
    assert instructions("coverage") == [LIKELIHOOD_INSTRUCTION]
    assert "one-sentence summary" in one.settings["design.likelihood_rule"]
    scripted.requests.clear()
    scripted.enqueue("support", lik(-1.0), lik(-1.0)).enqueue("baseline", *[lik(-4.0)] * 3)
    scripted.enqueue("coverage", lik(-1.0))
    scorer.score(SOURCE, "Lindford will build a library. It will cost 5 million pounds.", key_facts=["F."])
    assert instructions("support") == [LIKELIHOOD_INSTRUCTION] * 2
    assert set(instructions("baseline")) == {LIKELIHOOD_INSTRUCTION}


def test_likelihood_verdicts_cannot_answer_questions(scripted):
    with pytest.raises(UsageError, match="likelihood verdicts check statements, not questions"):
        scorer_with(scripted, claims="sentences", verdicts="likelihood").score(SOURCE, SUMMARY, questions=["Q?"])


def test_long_source_claim_supported_only_by_its_second_piece(scripted):
    # A scripted context of 55 words: the source goes in two pieces; the claim is checked against each, and the
    # second piece (where the fact is) supports it.
    source = " ".join(f"Sentence {i} says nothing new here." for i in range(10)) + " The library opens in 2027."
    engine = ScriptedEngine(context_tokens=55)
    engine.enqueue("support", lik(-4.0), lik(-1.0)).enqueue("baseline", lik(-4.2), lik(-4.2))
    engine.enqueue("coverage", lik(-1.0)).enqueue("baseline", lik(-4.0))
    r = scorer_with(engine, claims="sentences", verdicts="likelihood", prompt_style="bare").score(
        source, "The library opens in 2027.", key_facts=["It opens in 2027."]
    )
    assert r.source_pieces == 2
    pieces = [q.messages[-1]["content"] for q in engine.requests if q.stage == "support"]
    assert "opens in 2027" not in pieces[0] and "opens in 2027" in pieces[1]
    claim = r.claims[0]
    assert claim["supported"] and claim["piece"] == 1 and claim["pmi"] == pytest.approx(3.2)
    assert claim["p_supported"] == pytest.approx(1 / (1 + math.exp(-1.2)))  # the best piece's, not the first's
    assert set(r.stages) >= {"support.0.0", "support.0.1", "support.0.0.baseline", "support.0.1.baseline"}


def test_deepeval_flavor_asks_exactly_n_questions_of_source_and_summary_and_does_not_round(scripted):
    questions = {"questions": ["Did the council vote?", "Is it on Mill Street?", "Does construction begin in 2030?"]}
    scripted.enqueue("claims", CLAIMS).enqueue("questions", questions).enqueue("support", *SUPPORT)
    scripted.enqueue("coverage", "Yes", "No", "Yes").enqueue("source_answer", "Yes", "Yes", "No")
    r = scorer_with(scripted, flavor="deepeval", max_questions=3).score(SOURCE, SUMMARY)
    schema = [q for q in scripted.requests if q.stage == "questions"][0].schema.model_json_schema()
    assert schema["properties"]["questions"]["minItems"] == schema["properties"]["questions"]["maxItems"] == 3
    assert [v["source_answered"] for v in r.coverage_verdicts] == [True, True, False]
    assert r.coverage == 0.5  # the third question is not the source's, so it does not count
    assert r.score == pytest.approx(0.5) and r.alignment == 2 / 3
    two = scorer_with(enqueue_two_axis(ScriptedEngine()), flavor="deepeval")
    assert two.max_questions == 5  # DeepEval's n


def test_deepeval_flavor_score_is_unrounded(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("support", *SUPPORT).enqueue("coverage", "Yes")
    scripted.enqueue("source_answer", "Yes")
    r = scorer_with(scripted, flavor="deepeval").score(SOURCE, SUMMARY, questions=["Q?"])
    assert r.score == 2 / 3


def test_strict_mode_and_threshold(scripted):
    r = scorer_with(enqueue_two_axis(scripted), strict_mode=True).score(SOURCE, SUMMARY)
    assert (r.alignment, r.coverage, r.score, r.passed) == (0.0, 0.0, 0.0, False)
    assert "strict mode" in r.reason


def test_include_reason_off_asks_for_no_reasons_and_gives_none(scripted):
    scripted.enqueue("claims", {"claims": ["c"]}).enqueue("questions", {"questions": ["Did the council vote?"]})
    scripted.enqueue("support", "Yes").enqueue("coverage", "Yes")
    r = scorer_with(scripted, include_reason=False).score(SOURCE, SUMMARY)
    assert r.reason is None and r.score == 1.0
    for req in scripted.requests:
        if req.stage in ("support", "coverage"):
            assert req.schema.reason_chars is None and "Reason" not in req.messages[-1]["content"]


def test_a_verdict_reply_that_is_not_yes_or_no_fails_the_stage_with_its_raw_text(scripted):
    scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS).enqueue("support", "Maybe", *SUPPORT[1:])
    scripted.enqueue("coverage", *COVERAGE)
    with pytest.raises(JudgeOutputError, match='stage "support" for id "0"') as info:
        scorer_with(scripted).score(SOURCE, SUMMARY)
    assert info.value.raw_output == "Maybe"


def test_score_many_sends_each_wave_for_all_samples_in_one_engine_call(scripted):
    results = scorer_with(enqueue_two_axis(scripted, times=3)).score_many([(SOURCE, SUMMARY)] * 3)
    assert [r.score for r in results] == [0.5] * 3
    assert scripted.calls == [6, 15]  # wave 1: claims + questions of 3 samples; wave 2: 3 claims + 2 questions x 3
    assert [q.sample_id for q in scripted.requests if q.stage == "support"] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3


def test_failed_stage_raises_with_raw_output_or_is_recorded_as_failed_row(scripted):
    scripted.enqueue("claims", '{"claims": ["x", "y')  # truncated: what a token cap leaves
    scripted.enqueue("questions", QUESTIONS)
    with pytest.raises(JudgeOutputError, match='stage "claims" for id "0"') as info:
        scorer_with(scripted).score(SOURCE, SUMMARY)
    assert info.value.raw_output.startswith('{"claims"')

    scripted.enqueue("claims", "not json", CLAIMS).enqueue("questions", QUESTIONS, QUESTIONS)
    scripted.enqueue("support", *SUPPORT).enqueue("coverage", *COVERAGE)
    rows = scorer_with(scripted).score_many(
        [{"id": "bad", "source": SOURCE, "summary": SUMMARY}, {"id": "good", "source": SOURCE, "summary": SUMMARY}],
        on_error="return",
    )
    assert isinstance(rows[0], FailedRow) and rows[0].error["stage"] == "claims"
    assert rows[0].error["raw_output"] == "not json" and rows[0].to_dict()["score"] is None
    assert rows[1].score == 0.5  # the other row goes on


def test_ascore_gives_the_same_result(scripted):
    r = asyncio.run(scorer_with(enqueue_two_axis(scripted)).ascore(SOURCE, SUMMARY))
    assert r.score == 0.5


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"max_questions": 0}, "max_questions must be an integer from 1 to 200. Given: 0"),
        ({"max_questions": 100_000}, "from 1 to 200. Given: 100000"),
        ({"scale": -1}, "scale must be > 0. Given: -1"),
        ({"threshold": 2}, "threshold must be between 0 and 1. Given: 2"),
        ({"flavor": "ragas"}, "flavor must be one of mastra, deepeval"),
        ({"claims": "words"}, "claims must be auto or one of atomic, sentences"),
        ({"verdicts": "vibes"}, "verdicts must be auto or one of yes-no, likelihood"),
        ({"questions": ["q"], "key_facts": ["f"]}, "questions or key_facts"),
    ],
)
def test_bad_settings_are_usage_errors(kw, message):
    with pytest.raises(UsageError, match=message):
        SummarizationScorer(**kw)


@pytest.mark.parametrize("summary", ["", "  \n\t "])
def test_scripted_empty_summary_scores_0_with_a_reason_and_no_judge_call(scripted, summary):
    r = scorer_with(scripted).score(SOURCE, summary)
    assert (r.score, r.alignment, r.coverage, r.claims, r.questions, r.coverage_verdicts) == (0, 0, 0, [], [], [])
    assert r.empty_summary and not r.passed and r.stages == {} and scripted.requests == []
    assert r.reason == EMPTY_SUMMARY_REASON and r.reason.startswith("The score is 0 because the summary is empty")
    assert (r.soft_alignment, r.soft_coverage) == (0.0, 0.0)
    assert r.settings["design.claims"] == "atomic"  # the settings every row of the run records
    full = scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY)
    assert set(r.to_dict()) == set(full.to_dict()) and not full.empty_summary  # one shape for every row
    again = two_axis_score(r.claims, r.questions, r.coverage_verdicts)
    assert (again.score, again.alignment, again.coverage) == (0, 0, 0)


def test_scripted_empty_summary_keeps_the_users_questions_unanswered_in_either_flavor(scripted):
    for flavor in ("mastra", "deepeval"):
        r = scorer_with(scripted, flavor=flavor, questions=["Was a library built?", "Is it on Mill Street?"]).score(
            SOURCE, " "
        )
        assert r.score == 0 and r.coverage == 0 and r.coverage_from == "user_questions"
        assert [v["answered"] for v in r.coverage_verdicts] == [False, False]
    assert scripted.requests == []


def test_scripted_empty_source_stays_an_input_error_naming_the_field(scripted):
    with pytest.raises(ValueError, match='field "source" is empty or whitespace-only'):
        scorer_with(scripted).score("  \n", SUMMARY)


def test_rescoring_a_saved_row_reproduces_its_score(scripted):
    row = json.loads(json.dumps(scorer_with(enqueue_two_axis(scripted)).score(SOURCE, SUMMARY).to_dict()))
    again = two_axis_score(row["claims"], row["questions"], row["coverage_verdicts"])
    assert (again.score, again.alignment, again.coverage) == (row["score"], row["alignment"], row["coverage"])
    assert two_axis_score(row["claims"], row["questions"], row["coverage_verdicts"], scale=100).score == 50.0


def test_a_likelihood_verdict_names_its_weakest_token_with_what_the_judge_expected_there():
    """Pure reading, no model: per-token PMI is the text's log-probability minus the baseline's, token by token."""
    from offline_sumscore.core.schemas import Likelihood
    from offline_sumscore.scorers.stages.likelihood import weakest_token

    text = Likelihood(
        mean_logprob=-1.0,
        tokens=3,
        token_texts=["Marta", " lost", " it"],
        token_logprobs=[-0.1, -5.7, -0.2],
        expected_texts=["Marta", " won", " it"],
        expected_logprobs=[-0.05, -0.02, -0.1],
    )
    base = Likelihood(mean_logprob=-3.0, tokens=3, token_logprobs=[-6.0, -4.0, -1.0])
    e = weakest_token(text, base)
    assert e["token"] == " lost" and e["at"] == 1 and e["pmi"] == -1.7 and e["expected"] == " won"
    assert e["p_expected"] == 0.9802 and weakest_token(text, Likelihood(mean_logprob=-1, tokens=3)) is None
    assert e["word"] == "lost"
    # a bare space token (SmolLM2 writes " 4" as ' ' + '4') is named by the word it opens
    spaced = Likelihood(
        mean_logprob=-1.0,
        tokens=4,
        token_texts=["It", " cost", " ", "4"],
        token_logprobs=[-0.1, -0.2, -7.0, -0.1],
        expected_texts=["It", " cost", " four", "4"],
        expected_logprobs=[-0.1, -0.1, -0.5, -0.1],
    )
    e = weakest_token(spaced, Likelihood(mean_logprob=-1.0, tokens=4, token_logprobs=[-1.0, -1.0, -1.0, -1.0]))
    assert (e["token"], e["word"]) == (" ", "4")
    ended = Likelihood(**{**spaced.model_dump(), "token_texts": ["It", " cost", ".", " 4"]})
    assert weakest_token(ended, Likelihood(mean_logprob=-1.0, tokens=4, token_logprobs=[-1.0] * 4))["word"] == "."


def test_score_many_shows_a_progress_bar_when_asked(scripted, capsys):
    enqueue_two_axis(scripted, times=3)
    scorer = SummarizationScorer(engine=scripted, claims="atomic", coverage="questions", verdicts="yes-no")
    scorer.score_many([(SOURCE, SUMMARY)] * 3, progress=True)
    err = capsys.readouterr().err
    assert "scoring (two-axis)" in err and "3/3" in err
    enqueue_two_axis(scripted, times=1)
    scorer.score_many([(SOURCE, SUMMARY)])
    assert capsys.readouterr().err == ""  # silent unless asked
