"""What coverage checks, as pure text functions: the questions that count, and key sentences when no questions are
asked. No model code.

Questions a judge writes can repeat themselves or ask nothing specific ("What is the most important fact?",
written five times by the embedded judge). Neither may count twice toward coverage, so each question is kept or
dropped with a reason, and the reason is kept in the row:
- generic: it has no content word (a word of 3+ letters or digits that is neither a function word nor a word any
  question about any text could use, such as "fact", "article", "important"), so it names nothing to look for.
  (A specific question the source does not answer is another fault: DeepEval's flavor asks the source about it.)
- duplicate: its content words overlap an earlier kept question's by Jaccard >= 0.8 (so a reordering or a changed
  function word is the same question; "in 2027" against "in 2028" is not).

Key sentences (coverage without questions, FineSurE-style: each is checked against the summary as a statement):
the source's first sentences of at least 4 words. Chosen by measurement on SummEval with the embedded judge
(10 documents, 120 summaries; Spearman of soft coverage with expert relevance): the first 5 sentences 0.33, every
sentence 0.005. News puts its key facts first; for other genres give questions or key facts instead. A transcript's
sentences are its turns (source_pieces.is_transcript), taken without their speaker labels.
"""

from __future__ import annotations

import re

from offline_sumscore.core.source_pieces import is_transcript, sentences, without_speaker

DUPLICATE_JACCARD = 0.8
KEY_SENTENCE_MIN_WORDS = 4

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_FUNCTION_WORDS = frozenset(
    """
a about above after again against all also am an and any are as at be because been before being below between both
but by can could did do does doing down during each either few for from further had has have having he her here
hers herself him himself his how i if in into is it its itself just me more most my myself neither no nor not now of
off on once only or other our ours ourselves out over own same she should so some such than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when where which
while who whom why will with would yes you your yours yourself yourselves
""".split()
)
# Words any question about any text could use: a question made only of these asks nothing specific.
_GENERIC_WORDS = frozenset(
    """
article text source document story report passage summary information fact facts detail details point points topic
topics main important key major mentioned mention mentions say says said state states stated describe described
event events thing things something anything happen happened happens question questions answer true correct right
""".split()
)


def content_words(text: str) -> set[str]:
    return {
        w
        for w in (m.group().lower() for m in _WORD.finditer(text))
        if (len(w) >= 3 or w.isdigit()) and w not in _FUNCTION_WORDS and w not in _GENERIC_WORDS
    }


def distinct_questions(questions: list[str]) -> tuple[list[str], list[dict]]:
    """(kept questions in order, dropped ones as {"question", "why"})."""
    kept: list[str] = []
    kept_words: list[set[str]] = []
    dropped: list[dict] = []
    for question in questions:
        words = content_words(question)
        if not words:
            dropped.append({"question": question, "why": "generic: it names nothing specific to look for"})
            continue
        twin = next(
            (k for k, other in enumerate(kept_words) if len(words & other) / len(words | other) >= DUPLICATE_JACCARD),
            None,
        )
        if twin is not None:
            dropped.append({"question": question, "why": f"duplicate of question {twin + 1}: {kept[twin]!r}"})
            continue
        kept.append(question)
        kept_words.append(words)
    return kept, dropped


def key_sentences(source: str, k: int) -> list[str]:
    """The source's first k sentences of at least KEY_SENTENCE_MIN_WORDS words, stripped; a source with none that
    long ("Sales rose. Costs fell.") gives its first k sentences as they are, so that it still has items. A
    transcript's sentences are taken without their speaker labels, which the judge would otherwise look for in the
    summary (on a 6-turn call, "Alice: the budget ... is four million dollars" against a summary that states it:
    1.83 nats per token with the label, 2.50 without)."""
    pieces = sentences(source)
    if is_transcript(source):
        pieces = [without_speaker(piece) for piece in pieces]
    every = [text for text in (" ".join(piece.split()) for piece in pieces) if text]
    long_enough = [text for text in every if len(text.split()) >= KEY_SENTENCE_MIN_WORDS]
    return (long_enough or every)[:k]


# A summary written as a list or in markdown (as chat models write them): each item is its own claim, and neither
# the marker nor the emphasis is part of it. Without this, "- A\n- B" was one claim "- A - B" whose every token the
# judge weighed, markers included.
_LINE_BREAK = re.compile(r"\n(?![ \t]*[a-z])")  # a line that goes on in lower case continues its sentence
_LIST_MARKER = re.compile(r"^(?:[-*+•‣◦▪]|\d{1,3}[.)]|[a-z]\))\s+")
_EMPHASIS = re.compile(r"\*\*|__")
_MARKDOWN_HEADING = re.compile(r"#{1,6}\s")  # "# Key points"; not "#MeToo grew", which states something
HEADING_MAX_WORDS = 6


def summary_lines(summary: str) -> list[str]:
    """The summary's lines as a writer meant them: a list item or paragraph each, its marker and markdown emphasis
    taken off, whitespace collapsed; headings ("# Key points", "Key points:") dropped, since they state nothing."""
    out = []
    for line in _LINE_BREAK.split(summary):
        text = " ".join(_EMPHASIS.sub("", line).split())
        text = _LIST_MARKER.sub("", text)
        if _MARKDOWN_HEADING.match(text) or (text.endswith(":") and len(text.split()) <= HEADING_MAX_WORDS):
            continue
        if text:
            out.append(text)
    return out


def summary_sentences(summary: str) -> list[str]:
    """The summary's sentences as claims (claims="sentences"): the sentences of each of its lines (summary_lines),
    whitespace collapsed, empty ones dropped."""
    return [text for line in summary_lines(summary) for text in (" ".join(s.split()) for s in sentences(line)) if text]
