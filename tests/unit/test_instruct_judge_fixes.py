"""What the first instruct judge showed (issue 64), fixed without a model: the questions grammar admits only closed
questions, and a figure the claims stage dropped is still checked against the source."""

import pytest
from pydantic import ValidationError

from offline_sumscore.scorers.stages.questions import is_closed_question, questions_list
from offline_sumscore.scorers.two_axis_stages import figures_beyond_claims

SOURCE = (
    "Marta Ruiz won the regional chess championship in Valencia on Sunday. She is 17 years old and began playing "
    "at the age of six. The final lasted four hours."
)


@pytest.mark.parametrize(
    "question",
    ["Did Marta Ruiz win the championship?", "Is the library open on Sundays?", "Will the bridge reopen in May?"],
)
def test_closed_questions_pass_the_grammar(question):
    assert is_closed_question(question)
    assert questions_list(4, 200)(questions=[question]).questions == [question]


@pytest.mark.parametrize(
    "question",
    [
        "What is the name of the library?",  # open: a summary can never answer it "yes"
        "How many homes were evacuated?",
        "Did she win? Was it close?",  # two questions in one
        "Did she win",  # no question mark
        "Didn't she win?",  # a negated opening: "yes" is ambiguous
    ],
)
def test_open_or_malformed_questions_are_refused_by_the_grammar(question):
    assert not is_closed_question(question)
    with pytest.raises(ValidationError):
        questions_list(4, 200)(questions=[question])


def test_a_figure_the_claims_dropped_is_checked_against_the_source():
    summary = "Marta Ruiz, 27, won the regional chess championship in Valencia."
    judged = [{"claim": "Marta Ruiz won the regional chess championship in Valencia.", "supported": True}]
    added, named = figures_beyond_claims(summary, SOURCE, judged)
    assert len(added) == 1 and named == []
    claim = added[0]
    assert claim["supported"] is False and claim["overruled_by"] == "figures"
    assert claim["claim"] == summary
    assert [f["figure"] for f in claim["figures"]] == ["27"]
    assert claim["figures"][0]["source_says"].startswith("17")


def test_a_figure_a_claim_kept_or_the_source_states_adds_nothing():
    kept = "Marta Ruiz, 27, won the regional chess championship."
    judged = [{"claim": "Marta Ruiz is 27 years old.", "supported": False}]
    assert figures_beyond_claims(kept, SOURCE, judged) == ([], [])
    right = "Marta Ruiz, 17, won the regional chess championship."
    assert figures_beyond_claims(right, SOURCE, [{"claim": "Marta Ruiz won.", "supported": True}]) == ([], [])


def test_a_figure_the_source_states_nowhere_is_named_not_claimed():
    summary = "Marta Ruiz has 3,000 followers."
    added, named = figures_beyond_claims(summary, SOURCE, [{"claim": "Marta Ruiz has followers.", "supported": True}])
    assert added == []
    assert [(n["figure"], n["summary_sentence"]) for n in named] == [("3,000", summary)]
