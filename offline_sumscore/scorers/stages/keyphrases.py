"""The keyphrases stage (Ragas-style SummaryScore): the source (or a piece of it) -> its people, organisations,
places, dates, amounts and percentages, as written.

A list that parses can still be no answer. Instruct judges have returned the prompt's own kinds (['people',
'organisations', 'locations', 'dates', 'times', 'money amounts', 'percentages']); the embedded SmolLM2-135M writes
['people', 'organisations', 'locations'] for every demo text, and Qwen2.5-Coder-1.5B slipped "people" and "money"
among the real phrases of a text that names neither. Questions drawn on such phrases ask about nothing in the text.
A list of the prompt's kinds fails the stage with its raw output kept (degenerate_keyphrases), never feeds a score;
a phrase that shares no word with the text is dropped from the list (foreign), and the list fails if none is left.
"""

from __future__ import annotations

import re
from functools import cache

from pydantic import BaseModel

from offline_sumscore.core.prompts import fence, ragas
from offline_sumscore.core.schemas import text_list
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import refuse, require

# The kinds the prompt names, in its words: the prompt is built from them, so the check below knows them exactly.
KEYPHRASE_KINDS = ("people", "organisations", "locations", "dates and times", "money amounts", "percentages")
# What rows record (settings.design.keyphrase_rule), so that rows scored before the check can be told apart.
KEYPHRASE_RULE = (
    "keyphrases drawn from the text: a phrase with no word of the text dropped; a list of the prompt's own kinds, or "
    "with nothing left, fails"
)


def keyphrases_prompt(text: str) -> list[dict]:
    """Stage "keyphrases" (Ragas-style SummaryScore). The number is the judge's to choose, as in Ragas (the schema's
    safety bound aside)."""
    return ragas(
        f"{fence('text', text)}\n\n"
        f"Task: list the key phrases of these kinds found in the text: {', '.join(KEYPHRASE_KINDS)}. Copy each as "
        "written in the text."
    )


@cache
def keyphrases_list(max_keyphrases: int, text_chars: int) -> type[BaseModel]:
    """Stage "keyphrases" (Ragas-style): named entities, dates, money, percentages of the text."""
    return text_list("KeyphraseList", "keyphrases", text_chars, 0, max_keyphrases)


def keyphrases_request(sample_id: str, text: str, n: int, *, max_text_chars: int) -> StageRequest:
    """Up to n keyphrases of text (the number is the judge's to choose, as in Ragas; n is a safety bound)."""
    return StageRequest(sample_id, "keyphrases", tuple(keyphrases_prompt(text)), keyphrases_list(n, max_text_chars))


# Words that any English text holds: a phrase that shares only these with the text ("the Eiffel Tower" beside a text
# with "the") was not copied from it.
FUNCTION_WORDS = frozenset(
    "a an the of in on at to for by with from and or as is are was were be been it its his her their this that".split()
)


def words(text: str) -> list[str]:
    """A text's words as the check compares them: runs of letters, runs of digits, case folded ("4,000" is "4",
    "000"; "2km" is "2", "km", so that "2 km" is found in it)."""
    return re.findall(r"\d+|[^\W\d_]+", text.casefold())


def content_words(text: str) -> set[str]:
    return set(words(text)) - FUNCTION_WORDS


def _kind_names() -> frozenset[str]:
    """The prompt's kinds as a judge might echo them: each kind, each half of "dates and times", singular, and with
    the American spelling ("organization")."""
    names = set()
    for kind in KEYPHRASE_KINDS:
        for name in (kind, *kind.split(" and ")):
            for spelled in (name, name.replace("isation", "ization")):
                names.update({spelled, spelled.removesuffix("s"), spelled.split()[0]})
    return frozenset(names | {"person"})


KIND_NAMES = _kind_names()


def foreign(keyphrase: str, text: str) -> bool:
    """Whether a phrase shares no word with the text, function words aside: not copied from it, as the prompt asks.
    One shared word is enough: a judge may add a currency sign or join a name to its title ("£4 million" from
    "4 million pounds")."""
    return not content_words(text) & content_words(keyphrase)


def degenerate_keyphrases(keyphrases: list[str], kept: list[str]) -> str | None:
    """Why a keyphrase list is no answer about its text, or None where it is one: a list made only of the prompt's
    own kinds (even where the text happens to hold the word "people"), or one none of whose phrases was kept (every
    phrase foreign to the text)."""
    if keyphrases and all(" ".join(words(k)) in KIND_NAMES for k in keyphrases):
        return "the judge listed the prompt's own kinds of key phrase, not phrases of the text"
    if keyphrases and not kept:
        shown = "; ".join(repr(k) for k in keyphrases[:3]) + (
            f"; and {len(keyphrases) - 3} more" if len(keyphrases) > 3 else ""
        )
        return f"none of the {len(keyphrases)} key phrases shares a word with the text: {shown}"
    return None


def keyphrases_read(result: StageResult, stages: dict, key: str, text: str) -> list[str]:
    """The keyphrases of text that are drawn from it. A phrase foreign to the text is dropped, and kept in the
    stage's record under "dropped" (the 1.5B judge slipped "people" and "money" among the real phrases of a text
    that names neither); a list with nothing left, or made of the prompt's own kinds, fails the stage with its raw
    output kept."""
    keyphrases = list(require(result, stages, key).keyphrases)
    kept = [k for k in keyphrases if not foreign(k, text)]
    if len(kept) < len(keyphrases):
        stages[key]["dropped"] = [{"keyphrase": k, "why": "no word of the text"} for k in keyphrases if k not in kept]
    why = degenerate_keyphrases(keyphrases, kept)
    if why:
        raise refuse(result, stages, key, why)
    return kept
