"""Long sources: split on sentence boundaries into pieces that each fit the judge's context. Pure text functions;
the scorers ask the engine how many tokens a request leaves spare and split until every piece fits.

Nothing is ever truncated: every character of the source is in exactly one piece, in order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

# A sentence ends at . ! ? (or their CJK forms, or an ellipsis), after any closing quotes or brackets, before
# whitespace; a blank line ends a paragraph. CJK full stops need no space after them.
# In a text where two or more lines open with a speaker's label ("Alice: ...", "Speaker 2: ...", "[00:01:05] Dr. Lee:
# ...", or email headers, "Subject: ..."), each such line starts a turn of its own: a transcript without sentence
# punctuation was otherwise one sentence from first turn to last, and its coverage items the whole source checked as
# one statement. A single line break alone ends nothing (a hard-wrapped article would be cut into fragments), nor
# does one line that happens to open with "Word:".
_SPEAKER_LABEL = (
    r"[ \t]*(?:\[?\d{1,2}(?::\d{2}){1,2}\]?[ \t]+)?[A-Z][\w.'’-]*(?:[ \t]+(?:[A-Z][\w.'’-]*|\d+)){0,2}:[ \t]"
)
_SPEAKER_LINE = re.compile("^" + _SPEAKER_LABEL, re.MULTILINE)
_BOUNDARY = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+|(?<=[。！？])\s*|\n\s*\n")
_BOUNDARY_OR_TURN = re.compile(_BOUNDARY.pattern + r"|\n(?=" + _SPEAKER_LABEL + ")")


# A period that ends an abbreviation ends no sentence: "u.s. highway 36", "4:45 a.m. on", "Mr. Smith", "J. K. Rowling".
# Splitting there made claims of half sentences (FRANK's CNN/DM summaries: 10 of 185 split mid-sentence, and "." alone
# as a claim once). A sentence that does end in one ("... moved to the U.S. He ...") stays one with the next.
_ABBREVIATION = re.compile(
    r"(?:[A-Za-z]\.){2,}|[A-Z]\.|(?i:mr|mrs|ms|dr|prof|st|mt|jr|sr|gen|sen|rep|gov|lt|col|sgt|capt|inc|ltd|co|corp|vs)\."
)


def _ends_an_abbreviation(text: str, at: int) -> bool:
    """Whether the punctuation just before index at closes an abbreviation (the last word before it)."""
    before = text[max(0, at - 24) : at].split()  # a bounded look back: no abbreviation is longer
    return bool(before) and _ABBREVIATION.fullmatch(before[-1].lstrip("\"'“‘([")) is not None


def is_transcript(text: str) -> bool:
    """Whether two or more of the text's lines open with a speaker's label (_SPEAKER_LINE)."""
    return len(_SPEAKER_LINE.findall(text)) >= 2


def without_speaker(sentence: str) -> str:
    """A transcript's sentence without the speaker's label that opens it ("Alice: the budget is ..." -> "the budget
    is ..."): the label is the transcript's markup, not something a summary restates."""
    text = sentence.lstrip()
    label = _SPEAKER_LINE.match(text)
    return text[label.end() :] if label else text


def sentences(text: str) -> list[str]:
    """Pieces of text that concatenate back to it exactly, each ending at a sentence boundary."""
    out, start = [], 0
    for m in (_BOUNDARY_OR_TURN if is_transcript(text) else _BOUNDARY).finditer(text):
        if text[m.start() - 1 : m.start()] == "." and _ends_an_abbreviation(text, m.start()):
            continue
        if m.end() > start:
            out.append(text[start : m.end()])
            start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def _hard_split(sentence: str, size: int) -> list[str]:
    """A sentence longer than a whole piece: cut at the last whitespace before each size mark (or at the mark)."""
    parts = []
    while len(sentence) > size:
        cut = sentence.rfind(" ", size // 2, size)
        cut = cut + 1 if cut > 0 else size
        parts.append(sentence[:cut])
        sentence = sentence[cut:]
    return parts + [sentence] if sentence else parts


def split_into(text: str, n: int) -> list[str]:
    """About n pieces of about equal length, each a run of whole sentences (a sentence longer than a piece is cut
    at whitespace). Concatenated, the pieces are the text."""
    if n <= 1:
        return [text]
    size = math.ceil(len(text) / n)
    units = [part for s in sentences(text) for part in (_hard_split(s, size) if len(s) > size else [s])]
    pieces: list[str] = []
    current = ""
    for unit in units:
        if current and len(current) + len(unit) > size and len(pieces) < n - 1:
            pieces.append(current)
            current = ""
        current += unit
    pieces.append(current)
    return [p for p in pieces if p]


def fit_pieces(text: str, spare: Callable[[str], int | None], *, max_pieces: int = 256) -> list[str]:
    """The fewest pieces (found by growing n) whose every request fits: spare(piece) is the context tokens its
    request leaves spare (negative: over), None when the engine has no limit. A piece that cannot fit even as one
    sentence is left to the engine to fail loudly."""
    over = spare(text)
    if over is None or over >= 0:
        return [text]
    room = spare("")
    if room is None or room <= 0:
        return [text]  # the prompt does not fit even without the source: the engine says so for this row
    tokens = room - over  # tokens of the whole source
    n = max(2, math.ceil(tokens / (room * 0.9)))
    while True:
        pieces = split_into(text, n)
        if all((spare(p) or 0) >= 0 for p in pieces) or n >= max_pieces:
            return pieces
        n += max(1, n // 4)


def allot(total: int, weights: Sequence[float]) -> list[int]:
    """Split total into integer shares proportional to weights (largest remainder; ties to the earlier piece)."""
    if not weights:
        return []
    whole = sum(weights)
    exact = [total * w / whole if whole else total / len(weights) for w in weights]
    shares = [math.floor(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: (-(exact[i] - shares[i]), i))[: total - sum(shares)]:
        shares[i] += 1
    return shares
