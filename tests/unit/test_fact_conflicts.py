"""The likelihood verdict's fact conflicts, on token profiles written by hand (no model): a number where the judge,
given the text, expected another number lowers the verdict; a pronoun where it expected a name does not."""

import math

from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.scorers.two_axis_stages import (
    CONFLICT_WEIGHT,
    VerdictStage,
    swaps_a_fact,
    typed_conflict,
    word_around,
    written_token,
)


def profile(tokens, with_text, without, expected, p_expected):
    text = Likelihood(
        mean_logprob=sum(with_text) / len(with_text),
        tokens=len(tokens),
        token_texts=tokens,
        token_logprobs=with_text,
        expected_texts=expected,
        expected_logprobs=[math.log(p) for p in p_expected],
    )
    base = Likelihood(mean_logprob=sum(without) / len(without), tokens=len(tokens), token_logprobs=without)
    base.token_texts = tokens
    return text, base


def test_a_changed_number_is_a_conflict_named_by_its_whole_word():
    tokens = ["Marta", ",", " ", "2", "7", ",", " won"]
    text, base = profile(
        tokens,
        [-0.1, -0.1, -0.1, -4.6, -0.1, -0.1, -0.2],
        [-6.0, -3.0, -2.0, -0.5, -2.0, -1.0, -5.0],
        ["Marta", ",", " ", "1", "7", ",", " won"],
        [0.9, 0.9, 0.9, 0.98, 0.9, 0.9, 0.8],
    )
    c = typed_conflict(text, base)
    assert c["word"] == "27" and c["expected_word"] == "17" and c["pmi"] == round(-4.6 + 0.5, 3)
    assert c["p_expected"] == 0.98 and c["at"] == 3
    stage = VerdictStage("likelihood", "bare", False, 0, 2.0)
    from offline_sumscore.core.stages import StageResult

    replies = [StageResult(request=None, value=v, raw_output="") for v in (text, base)]
    got = stage.read(replies, {}, "support.0")
    mean = text.mean_logprob - base.mean_logprob
    assert got["pmi"] == round(mean, 6) and mean >= 2.0  # the mean alone would pass it
    assert got["verdict"] is False and got["verdict_score"] == round(mean + CONFLICT_WEIGHT * c["pmi"], 6)
    assert got["conflict"]["word"] == "27"


def test_a_pronoun_for_a_name_or_a_synonym_is_no_conflict():
    assert not swaps_a_fact(" she", " Marta")  # a pronoun where the source names her: a paraphrase
    assert not swaps_a_fact(" stated", " said")
    assert not swaps_a_fact(" two", " 2")  # a number written out
    assert swaps_a_fact(" 27", " 17") and swaps_a_fact(" Paris", " London")
    assert swaps_a_fact(" not", " won") and swaps_a_fact(" won", " not")  # a negation on one side: the sense flips
    assert not swaps_a_fact(" n't", " not") and not swaps_a_fact(" didn't", " not")  # the same negation, contracted
    tokens = [" and", " she", " won"]
    text, base = profile(tokens, [-0.5, -3.0, -0.1], [-2.0, -1.0, -4.0], [" and", " Marta", " won"], [0.9, 0.9, 0.9])
    assert typed_conflict(text, base) is None  # the text made "she" less likely than "Marta": still a paraphrase


def test_a_conflict_the_text_made_more_likely_does_not_count():
    tokens = [" 4", " million"]
    text, base = profile(tokens, [-1.0, -0.1], [-5.0, -3.0], [" 40", " million"], [0.6, 0.9])
    assert typed_conflict(text, base) is None  # " 4" is less expected than " 40", but the text raised it: PMI +4


def test_a_contraction_the_tokenizer_cut_is_read_whole():
    # "did n't" as a tokenized summary writes it: ' n' then "'t"; the judge expecting ' not' there is no swap
    tokens = [" did", " n", "'t", " notice"]
    assert written_token(tokens, 1) == " n't" and written_token(tokens, 0) == " did"
    assert written_token([" isn", "\u2019", "t", " it"], 0) == " isn\u2019t"
    assert written_token([" Roots", "'", " in"], 0) == " Roots'"
    text, base = profile(
        tokens,
        [-0.2, -6.0, -0.1, -1.0],
        [-2.0, -2.0, -3.0, -4.0],
        [" did", " not", "'t", " notice"],
        [0.9, 0.96, 0.9, 0.9],
    )
    assert typed_conflict(text, base) is None


def test_word_around_joins_the_pieces_of_a_word():
    assert word_around([" in", " 20", "1", "4", "."], 2, "5") == ("2014", "2054")
    assert word_around([" lost", " the"], 0, " won") == ("lost", "won")
