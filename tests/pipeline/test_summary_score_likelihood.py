"""Summary-score's tiny-judge mode (answers="likelihood") on a scripted judge: which items it checks, and how."""

from offline_sumscore import SummaryScore


def lik(mean_logprob, tokens=3):
    return {"mean_logprob": mean_logprob, "tokens": tokens}


def test_a_source_of_short_sentences_is_checked_sentence_by_sentence_not_cut(scripted):
    # No sentence reaches the key-sentence length: the items are its sentences as they are (once, the source's
    # whitespace cut to 2,000 characters was the one item: a silent cut)
    source = "Sales rose.  Costs fell. " + "Ok. " * 800
    scripted.enqueue("ragas_answers", lik(-1.0), lik(-4.0)).enqueue("baseline", lik(-4.0), lik(-3.0))
    r = SummaryScore(engine=scripted, answers="likelihood", key_sentences=2).score(source, "Sales rose; costs fell.")
    assert r.questions == ["Sales rose.", "Costs fell."]
    assert [(q.stage, q.continuation) for q in scripted.requests] == [
        ("ragas_answers", "Sales rose."),
        ("baseline", "Sales rose."),
        ("ragas_answers", "Costs fell."),
        ("baseline", "Costs fell."),
    ]
    assert r.answers == ["1", "0"] and r.qa == 0.5  # PMI 3.0 passes the 2.0 threshold, -1.0 does not
