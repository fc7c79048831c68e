"""The likelihood verdict's fact conflicts, on token profiles written by hand (no model): a number where the judge,
given the text, expected another number lowers the verdict; a pronoun where it expected a name does not."""

import math

from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.scorers.stages.likelihood import (
    CONFLICT_WEIGHT,
    expected_word,
    fact_kind,
    opens_like_the_text,
    swaps_a_fact,
    typed_conflict,
    word_around,
    written_token,
)
from offline_sumscore.scorers.stages.verdict import VerdictStage


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
    c = typed_conflict(text, base, context="Marta, 17, won the national title on Sunday.")
    assert c["word"] == "27" and c["expected_word"] == "17" and c["pmi"] == round(-4.6 + 0.5, 3)
    assert c["p_expected"] == 0.98 and c["at"] == 3
    stage = VerdictStage("likelihood", "bare", False, 0, 2.0)
    from offline_sumscore.core.stages import StageResult

    replies = [StageResult(request=None, value=v, raw_output="") for v in (text, base)]
    got = stage.read(replies, {}, "support.0", "Marta, 17, won the national title on Sunday.")
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
    assert word_around([" in", " 20", "1", "4", "."], 2) == "2014"
    assert word_around([" lost", " the"], 0) == "lost"


def test_the_expected_word_is_the_texts_word_never_the_judges_token_glued_to_the_summarys():
    # "a 21 million dollar budget" against a text saying 12: at the '2' the judge expects '1', the first digit of
    # "12". Glued to the rest of the summary's word that read "11", a number no text holds.
    tokens = [" a", " ", "2", "1", " million", " dollar"]
    text = "The council approved a 12 million dollar budget, and 1 more vote is due in 2026."
    assert expected_word(tokens, 2, "1", text) == "12"  # "1" and "12" begin so; "12 million" fits the statement
    # no word of the text begins so: nothing is named, never the token as a word's start ('1…') nor alone
    assert expected_word(tokens, 2, "1", "No number here.") is None
    assert expected_word(tokens, 2, "1", None) is None
    # a word piece the judge copies: "Mart" + "in" where the summary has "Marta"; the text has "Martina"
    assert expected_word([" Mart", "a", " won"], 1, "in", "Martina Ruiz won the title.") == "Martina"
    assert expected_word([" two", " days"], 0, " six", "after six hours") == "six"  # a whole word is itself
    assert expected_word([" evacuated", "."], 1, ",", "evacuated, and") == ","  # punctuation stands for itself
    assert expected_word([" ", "1", ",", "2", "0", "0"], 4, "0", "1,200 patients") == "1,200"  # the summary's own
    assert word_around([" ", "1", ",", "2", "0", "0", "-", "patient"], 3) == "1,200"  # a number's separators inside


def test_no_conflict_where_the_judge_only_expects_the_texts_first_word():
    # "Trials of a ... " against "Pharmaceutical company Veloran said ...": at a statement's opening the judge begins
    # to quote the text from its top ('Ph'), which says how the text opens, not that "Trials" is a wrong name.
    source = "Pharmaceutical company Veloran said on Monday that its asthma medicine cut admissions by 31 percent."
    tokens = ["Trials", " a", " trial", ",", " Veloran"]
    text, base = profile(
        tokens,
        [-6.5, -1.0, -0.5, -0.3, -0.2],
        [-2.0, -1.5, -4.0, -1.0, -9.0],
        ["Ph", " a", " trial", ",", " Veloran"],
        [0.83, 0.5, 0.5, 0.5, 0.9],
    )
    assert opens_like_the_text(tokens, 0, "Ph", source) and not opens_like_the_text(tokens, 4, " Ver", source)
    assert typed_conflict(text, base, context=source) is None
    assert typed_conflict(text, base)["word"] == "Trials"  # without the text's opening to compare, it counted
    # the opening word still conflicts where the judge expects another word than the text's first
    assert typed_conflict(text, base, context="Veloran, a pharmaceutical company, said ...")["word"] == "Trials"
    # and a capitalized function word is no name at all: "In" opening a sentence where the judge expects "The"
    assert fact_kind("In") is None and fact_kind("From") is None and fact_kind("Veloran") == "name"


def test_numbers_written_in_words_are_numbers():
    assert fact_kind(" six") == fact_kind("Two") == "number word" and fact_kind(" 6") == "number"
    assert swaps_a_fact(" two", " six") and not swaps_a_fact(" two", " 2")
    # "two days" where the text says "six hours": the text made "two" likelier than it is alone (PMI +1.2), as it
    # does any number word; the conflict is read against the word the judge expected instead
    tokens = [" after", " two", " days"]
    text, base = profile(tokens, [-0.3, -5.1, -0.4], [-3.0, -6.3, -1.9], [" after", " six", " days"], [0.7, 0.74, 0.6])
    c = typed_conflict(text, base, context="under control after six hours on Saturday")
    assert c["word"] == "two" and c["expected_word"] == "six" and c["pmi"] == round(-5.1 - math.log(0.74), 3)
    digits = [" after", " 2", " days"]  # digits keep the PMI rule: the text raised " 2", so no conflict
    text, base = profile(digits, [-0.3, -5.1, -0.4], [-3.0, -6.3, -1.9], [" after", " 6", " days"], [0.7, 0.74, 0.6])
    assert typed_conflict(text, base, context="after 6 hours") is None


def test_a_word_the_source_holds_in_its_place_is_never_a_conflict_and_the_next_worst_is_read():
    # "Prices rose 6.4 percent as Arsenal beat Chelsea" against "... up 6.4 percent ... Chelsea beat Arsenal": at the
    # copied "6.4" the judge expects '2' (another figure three paragraphs on), at the swapped "Arsenal" it expects
    # "Chelsea". The copied figure is no conflict, however low its PMI; the swap is.
    sentence = "Prices were up 6.4 percent on Saturday as Chelsea beat Arsenal."
    tokens = [" up", " ", "6", ".", "4", " percent", " as", " Arsenal", " beat", " Chelsea"]
    text, base = profile(
        tokens,
        [-0.2, -0.1, -6.0, -0.1, -0.1, -0.1, -0.3, -3.0, -0.2, -0.3],
        [-2.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -2.0, -1.0, -1.0],
        [" up", " ", "2", ".", "4", " percent", " as", " Chelsea", " beat", " Arsenal"],
        [0.6, 0.6, 0.9, 0.6, 0.6, 0.6, 0.6, 0.8, 0.6, 0.6],
    )
    assert typed_conflict(text, base, context=sentence)["word"] == "6.4"  # the whole text: the copied word counted
    found = typed_conflict(text, base, context=sentence, aligned=sentence)
    assert found["word"] == "Arsenal" and found["expected_word"] == "Chelsea"
