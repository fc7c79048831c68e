"""The likelihood verdict's fact-conflict rules: which token of a statement the judge expected otherwise, of the
same kind as the text's (a number for a number, a name for a name, a negation on one side), and the evidence shown
for it."""

from __future__ import annotations

import math
import re

from offline_sumscore.core.figures import holds_in_place
from offline_sumscore.core.schemas import Likelihood

# The likelihood verdict's rule: the mean PMI per token, less half the PMI of the worst fact conflict (below). Measured
# on the perturbation set and the labelled data (research/verdict_rules.py, results/verdict_rules.md): a changed
# number now fails 88% of the time instead of 3%, a changed date 62%, a negation 63%, while 97% of faithful
# paraphrases still pass, and FRANK, SummEval and REALSumm stay within their intervals.
CONFLICT_WEIGHT = 0.5
CONFLICT_CONFIDENCE = 0.5  # the judge's probability of the other token, given the text, for a conflict
LIKELIHOOD_RULE = (
    f"mean PMI + {CONFLICT_WEIGHT:g} x the PMI of the worst fact conflict "
    f"(number for number, number word for number word, name for name, or a negation on one side; "
    f"p >= {CONFLICT_CONFIDENCE:g}; none where the judge expects the text's first word; the word expected a whole "
    "word of the text's sentence the statement sits in, and the written one not there as written in its place; a "
    "capitalized function word no name); "
    "a summary of one sentence asked as a one-sentence summary, any other statement as a quote"
)
NEGATIONS = frozenset({"not", "n't", "never", "no", "nor", "cannot", "without"})
FUNCTION_WORDS = frozenset(
    "a an the this that these those it its he she they we you i his her their our my your in on at from to for of by "
    "with as after before during since until while when where which who what if but and or so then there here all "
    "some most many more each every both one".split()
)
# Numbers written in words: "two days" where the text says "six hours" is a changed number. A word is compared with a
# word only: a tokenizer that cuts "20" into "2" and "0" shows the judge expecting "2" where a summary says "twenty".
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion "
    "trillion dozen".split()
)


def fact_kind(text: str) -> str | None:
    """What a token would change if swapped: "number" (digits), "number word" ("six"), "name" (capitalized),
    "negation"; None for other words."""
    word = text.strip().strip("\"'.,;:!?()")
    if not word:
        return None
    if any(c.isdigit() for c in word):
        return "number"
    if word.lower() in NUMBER_WORDS:
        return "number word"
    if word.lower() in NEGATIONS or word.lower().endswith(("n't", "n’t")):
        return "negation"
    # A capital opens a sentence as well as a name: "From" where the judge expects "The" swaps no fact.
    return "name" if word[0].isupper() and word.lower() not in FUNCTION_WORDS else None


def swaps_a_fact(written: str, expected: str) -> bool:
    """A number where the judge expected another number (digits for digits, a number word for a number word), a name
    where it expected another name, or a negation on one side only (the sense flips). A pronoun for a name, "two" for
    "2", "n't" for "not": a paraphrase, not a swap. `written` is the token with any contraction after it joined on
    (written_token)."""
    mine, theirs = fact_kind(written), fact_kind(expected)
    if "negation" in (mine, theirs):
        return mine != theirs
    return mine is not None and mine == theirs


def written_token(tokens: list[str], at: int) -> str:
    """Token `at` with the contraction the tokenizer cut off after it (' n' + "'t": " n't"; ' didn' + "'t"), so that
    a tokenized "did n't" is read as the negation it is, not as the word "n"."""
    word, end = tokens[at], at + 1
    while end < len(tokens) and (tokens[end][:1] in "'’" or word[-1:] in "'’") and tokens[end][:1].strip():
        word, end = word + tokens[end], end + 1
    return word


def word_span(tokens: list[str], at: int) -> tuple[int, int]:
    """The tokens [start, end) of the whole word that token `at` is part of; a number's digits with the commas and
    points between them are one word ("1,200", "3.5")."""

    def joined(left: str, mid: str, right: str) -> bool:  # "1" "," "200": a separator inside a number
        return mid in (",", ".") and left[-1:].isdigit() and right[:1].isdigit()

    start, end = at, at + 1
    while start > 0:
        if not tokens[start].startswith(" ") and tokens[start - 1][-1:].isalnum():
            start -= 1
        elif start > 1 and joined(tokens[start - 2], tokens[start - 1], tokens[start]):
            start -= 2
        else:
            break
    while end < len(tokens):
        if not tokens[end].startswith(" ") and tokens[end][:1].isalnum():
            end += 1
        elif end + 1 < len(tokens) and joined(tokens[end - 1], tokens[end], tokens[end + 1]):
            end += 2
        else:
            break
    return start, end


def word_around(tokens: list[str], at: int) -> str:
    """The whole word that token `at` is part of ('2' of "27": "27")."""
    start, end = word_span(tokens, at)
    return "".join(tokens[start:end]).strip()


# A word of a text as a reader quotes it: letters and digits, with the commas, points, hyphens and apostrophes inside
# it ("1,200", "3-1", "Veloran's"), none at its ends.
_TEXT_WORD = re.compile(r"(?<![\w])\w(?:[\w,.'’-]*\w)?")


def expected_word(tokens: list[str], at: int, expected: str, text: str | None) -> str | None:
    """The word the judge expects at token `at`, as a whole word of the text it read (the sentence of the text the
    statement sits in, where the caller gives it), or None where the text holds no such word: never a token, nor a
    token's start ('1…'), nor the judge's token glued to the rest of the summary's word, each of which named words no
    text holds (a '2' shown against the "1.2" a source states). The judge picks one token: where that token completes
    a word of its own, the word is that token, if the text holds it; else the judge is copying a word of the text (a
    '1' where the summary has the '2' of "21", against a text saying "12 million"), and the word shown is the text's
    word that begins so, the one whose neighbours match the statement's where several do."""
    if not any(ch.isalnum() for ch in expected):  # punctuation stands for itself
        return expected.strip()
    if expected == tokens[at]:
        return word_around(tokens, at)
    start, end = word_span(tokens, at)
    fresh = expected[:1].isspace() or start == at
    prefix = expected.strip() if fresh else "".join(tokens[start:at]).lstrip() + expected
    whole = end == at + 1 and (fresh or not expected[-1:].isalnum())
    found = [m for m in _TEXT_WORD.finditer(text or "") if m.group().startswith(prefix)]
    if whole:  # the token completes a word: that word, where the text holds it whole
        found = [m for m in found if m.group() == prefix] or found
    if not found:
        return None
    after = "".join(tokens[end:]).split()[:1]  # the statement's next word, to pick among the text's candidates
    before = "".join(tokens[:start]).split()[-1:]

    def fit(m: re.Match) -> tuple[int, int]:
        return (text[m.end() :].split()[:1] == after) + (text[: m.start()].split()[-1:] == before), -m.start()

    best = max(found, key=fit)
    rivals = {m.group() for m in found if fit(m)[0] == fit(best)[0]}
    return best.group() if len(rivals) == 1 or best.group() == prefix else None


def opens_like_the_text(tokens: list[str], at: int, expected: str, text: str | None) -> bool:
    """Token `at` lies in the statement's first word, and the judge expects the text's own first word there: at the
    start of a statement the judge begins to quote the text from its top ('Ph' of "Pharmaceutical company Veloran
    said..." where a paraphrase opens "In a trial..."). That says how the text opens, not what it states."""
    opening = len("".join(tokens[: at + 1]).split()) <= 1
    return bool(opening and text and expected.strip() and text.lstrip().startswith(expected.strip()))


def copied(sentence: str, tokens: list[str], at: int) -> bool:
    """Whether the text's sentence holds the word of the statement's token `at` as written, in its place (beside the
    same word before or after it: core.figures.holds_in_place)."""
    start, end = word_span(tokens, at)
    before = "".join(tokens[:start]).split()[-1:]
    after = "".join(tokens[end:]).split()[:1]
    return holds_in_place(sentence, word_around(tokens, at), before[0] if before else "", after[0] if after else "")


def typed_conflict(
    text: Likelihood,
    base: Likelihood,
    confident: float = CONFLICT_CONFIDENCE,
    context: str | None = None,
    aligned: str | None = None,
) -> dict | None:
    """The statement's worst fact conflict: a token where the text makes the judge confident (p >= confident, 0.5 in
    the product) of another token of the same kind (swaps_a_fact), and which the text made less likely than it is
    without it (negative PMI); not where the judge only expects the text's opening words (opens_like_the_text).
    context: the text the statement was checked against; aligned: its sentence the statement sits in (core.figures),
    which names the word the judge expects (expected_word; the whole context where not given), and where no token is
    a conflict without a whole word of the text's own in its place or with the statement's word there as written.
    None where there is none (or the engine read no tokens: a scripted judge)."""
    if not text.token_logprobs or len(text.token_logprobs) != len(base.token_logprobs):
        return None
    worst = None
    tokens = text.token_texts
    rows = zip(tokens, text.token_logprobs, base.token_logprobs, text.expected_texts, text.expected_logprobs)
    for at, (token, lp, bp, expected, elp) in enumerate(rows):
        if expected.strip() == token.strip() or math.exp(elp) < confident:
            continue
        written = written_token(tokens, at)
        if not swaps_a_fact(written, expected) or opens_like_the_text(tokens, at, expected, context):
            continue
        # A text that gives any number in words makes every number word likelier than it is without it, the wrong
        # one too ("two" after a text saying "six hours": PMI +1.2), so a number word's conflict is read against
        # the word the judge expected instead (log p(two) - log p(six), given the text: -4.8) where that is lower.
        strength = lp - bp if fact_kind(written) != "number word" else min(lp - bp, lp - elp)
        if strength >= 0 or (worst is not None and strength >= worst[1]):
            continue
        # Read where the statement sits in the text: a conflict needs a word of the text's own in its place, and
        # none where the text holds the statement's word there as written (the judge expecting "2" at the "1.2"
        # the source states is no error of the summary's).
        if aligned and (not named_expected(tokens, at, expected, aligned, context) or copied(aligned, tokens, at)):
            continue
        worst = (at, strength)
    if worst is None:
        return None
    at, pmi = worst
    return {
        "token": tokens[at],
        "word": word_around(tokens, at),
        "at": at,
        "pmi": round(pmi, 3),
        "p": round(math.exp(text.token_logprobs[at]), 4),
        "expected": text.expected_texts[at],
        "expected_word": named_expected(tokens, at, text.expected_texts[at], aligned, context),
        "p_expected": round(math.exp(text.expected_logprobs[at]), 4),
    }


def named_expected(tokens: list[str], at: int, expected: str, aligned: str | None, context: str | None) -> str | None:
    """The word the judge expects, as a whole word of the sentence the statement sits in, else of the whole text (an
    age stated in the sentence after the one a summary's sentence matches best), else None."""
    return (aligned and expected_word(tokens, at, expected, aligned)) or expected_word(tokens, at, expected, context)


def weakest_token(
    text: Likelihood, base: Likelihood, context: str | None = None, aligned: str | None = None
) -> dict | None:
    """The statement's token that the text made least likely against the judge's expectation without it (the
    lowest pointwise mutual information), the whole word it is part of, and what the judge expected most there given
    the text (the token, and the word of the context it begins: expected_word): the words behind a likelihood
    verdict. context: the text; aligned: its sentence the statement sits in, whose whole words are named as expected
    first (named_expected). None where the engine read no tokens (a scripted judge)."""
    if not text.token_logprobs or len(text.token_logprobs) != len(base.token_logprobs):
        return None
    pmis = [a - b for a, b in zip(text.token_logprobs, base.token_logprobs)]
    at = min(range(len(pmis)), key=pmis.__getitem__)
    token = text.token_texts[at]
    # A piece of a word is named by its word, a bare ' ' by the word it opens ("4"); punctuation stands for itself.
    punctuation = token.strip() and not any(ch.isalnum() for ch in token)
    return {
        "token": token,
        "word": token.strip() if punctuation else word_around(text.token_texts, at),
        "at": at,
        "pmi": round(pmis[at], 3),
        "p": round(math.exp(text.token_logprobs[at]), 4),
        "expected": text.expected_texts[at],
        "expected_word": named_expected(text.token_texts, at, text.expected_texts[at], aligned, context),
        "p_expected": round(math.exp(text.expected_logprobs[at]), 4),
    }
