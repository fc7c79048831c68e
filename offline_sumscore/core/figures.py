"""The figures a text states, and where a summary's sentence sits in its source: pure text functions, no model.

A judge's evidence must never accuse a correct word, and a wrong figure must be named with the figure the source
gives in its place, whatever the judge. So, for every judge:
- aligned_sentence: the source sentence a summary sentence was drawn from (the one sharing most of its content
  words), where a fact it states should be found;
- holds_in_place: whether that sentence holds a word as written, beside the same neighbour (a number, date, amount
  or name the summary copied is never a conflict; a name the sentence holds in another place, as in a swap of who
  won, still is);
- figure_check: each number, amount, percentage and date of a summary sentence that the source does not state at
  all (by value: "1.2 billion" is "1,200,000,000", "two" is "2", "per cent" is "%"), with the source's figure of the
  same kind in the aligned sentence, and the words after it ("3,870: the source says 1,870 vacant posts"): of the
  same measure where a unit follows it ("220 °C" against "180 degrees", never the "40 minutes" beside it), and for
  the same thing (the figure whose words around it the summary's figure shares, before the nearest value).
Numbers are compared by value and kind, so a summary may write "12%" for "12 per cent", "1.2bn" for "1.2 billion"
or "two" for "2"; a figure the source does not state anywhere is named, and where the aligned sentence states
another figure of its kind, that is a conflict the scorer counts against the claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from offline_sumscore.core.source_pieces import sentences

MONTHS = "january february march april may june july august september october november december".split()
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
NUMBER_WORDS = {
    w: n
    for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90})
NUMBER_WORDS.update({"hundred": 100, "dozen": 12})
SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "m": 1e6, "bn": 1e9, "k": 1e3}
CONTEXT_WORDS = 3  # words after a source figure shown beside it ("1,870 vacant posts")
_ALIGN_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_FIGURE = re.compile(
    r"(?P<currency>[£$€¥])?\s?(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?:\s?(?P<scale>thousand|million|billion|trillion|bn|m|k)\b)?"
    r"(?P<percent>\s?%|\s(?:per\s?cent|percent)\b)?",
    re.IGNORECASE,
)
_WORD_FIGURE = re.compile(
    r"\b(?P<word>" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")\b"
    r"(?:\s(?P<scale>thousand|million|billion|trillion)\b)?(?P<percent>\s(?:per\s?cent|percent)\b)?",
    re.IGNORECASE,
)
# What a figure's unit word measures: a figure measuring one thing never stands for one measuring another (a
# summary's "220 °C" is not the source's "40 minutes", whichever value is nearer).
UNITS = {
    **dict.fromkeys("°c °f ºc ºf degrees degree celsius fahrenheit".split(), "temperature"),
    **dict.fromkeys("seconds second secs minutes minute mins hours hour hrs days day weeks week".split(), "time"),
    **dict.fromkeys(
        "mm cm km metres meters metre meter kilometres kilometers miles mile feet foot ft inches".split(), "length"
    ),
    **dict.fromkeys("g grams gram kg kilograms kilogram tonnes tons lb lbs ounces oz".split(), "mass"),
    **dict.fromkeys("ml litres liters litre liter gallons".split(), "volume"),
}
_DATE_WORD = re.compile(r"\b(?P<word>" + "|".join(MONTHS + WEEKDAYS) + r")\b", re.IGNORECASE)
_STOP = frozenset("the a an of and to in on at for by with from as is was were are be has had have it its that".split())


@dataclass(frozen=True)
class Figure:
    text: str  # as written
    kind: str  # "number", "amount", "percent", "year", "month" or "weekday"
    value: float | str  # a number's value (scales applied), a date word's lower-cased name
    start: int
    end: int


def figures(text: str) -> list[Figure]:
    """Every figure of a text, in order: numbers in digits or words (with their scale: "1.2 billion"), amounts
    (with a currency sign), percentages, years (1900-2099, alone), month and weekday names."""
    found: list[Figure] = []
    for m in _FIGURE.finditer(text):
        value = float(m.group("number").replace(",", "")) * SCALES.get((m.group("scale") or "").lower(), 1)
        kind = "percent" if m.group("percent") else "amount" if m.group("currency") else "number"
        if kind == "number" and re.fullmatch(r"(19|20)\d\d", m.group("number")) and not m.group("scale"):
            kind = "year"
        found.append(Figure(m.group().strip(), kind, value, m.start(), m.end()))
    for m in _WORD_FIGURE.finditer(text):
        if any(f.start <= m.start() < f.end for f in found) or _pronoun_one(text, m):
            continue
        value = NUMBER_WORDS[m.group("word").lower()] * SCALES.get((m.group("scale") or "").lower(), 1)
        found.append(Figure(m.group(), "percent" if m.group("percent") else "number", value, m.start(), m.end()))
    for m in _DATE_WORD.finditer(text):
        word = m.group("word").lower()
        found.append(Figure(m.group(), "month" if word in MONTHS else "weekday", word, m.start(), m.end()))
    return sorted(found, key=lambda f: f.start)


# "one" that counts nobody: "no one was hurt", "the one who", "one of the players", "one another"
_ONE_BEFORE = frozenset("no any every each the this that which".split())
_ONE_AFTER = frozenset("of another".split())


def _pronoun_one(text: str, m: re.Match) -> bool:
    if m.group("word").lower() != "one" or m.group("scale") or m.group("percent"):
        return False
    before, after = text[: m.start()].split()[-1:], text[m.end() :].split()[:1]
    return bool(before and _bare(before[0]) in _ONE_BEFORE) or bool(after and _bare(after[0]) in _ONE_AFTER)


def same_figure(a: Figure, b: Figure) -> bool:
    """Two figures of one value and kind ("1.2bn" and "1,200,000,000"; "two" and "2")."""
    if isinstance(a.value, str) or isinstance(b.value, str):
        return a.value == b.value
    close = abs(a.value - b.value) <= 1e-9 * max(abs(a.value), abs(b.value), 1)
    return close and (a.kind == b.kind or {a.kind, b.kind} <= {"number", "amount", "year"})


def _kind_of(figure: Figure) -> str:
    return "number" if figure.kind in ("amount", "year") else figure.kind  # an amount may be written without its sign


def content_words(text: str) -> set[str]:
    return {w.lower() for w in _ALIGN_WORD.findall(text) if w.lower() not in _STOP}


def aligned_sentence(statement: str, source: str) -> str:
    """The source sentence sharing most content words with the statement (ties: the earlier); the source whole where
    it has no sentence."""
    words = content_words(statement)
    pieces = sentences(source) or [source]
    return max(pieces, key=lambda s: (len(words & content_words(s)), -pieces.index(s)))


def holds_in_place(sentence: str, word: str, before: str, after: str) -> bool:
    """Whether the sentence holds the word as written in the place the statement has it: beside the same word before
    it or after it ("up 6.4" where the summary says "up 6.4 percent"). A name the sentence holds elsewhere is not in
    place: "Arsenal beat Chelsea" where it says "Chelsea beat Arsenal" swaps who won."""
    word = word.strip(" .,;:!?\"'()")
    if not word:
        return False
    for m in re.finditer(r"(?<![\w])" + re.escape(word) + r"(?![\w])", sentence):
        prior = sentence[: m.start()].split()[-1:]
        next_ = sentence[m.end() :].split()[:1]
        if (before and prior and _bare(prior[0]) == _bare(before)) or (
            after and next_ and _bare(next_[0]) == _bare(after)
        ):
            return True
    return False


def _bare(word: str) -> str:
    return word.strip(" .,;:!?\"'()").lower()


def holds_word(sentence: str, word: str) -> bool:
    """Whether the sentence holds the word in the same form, as a whole word (case-sensitive for a name)."""
    word = word.strip(" .,;:!?\"'()")
    if not word:
        return False
    return re.search(r"(?<![\w])" + re.escape(word) + r"(?![\w])", sentence) is not None


def figure_check(statement: str, source: str) -> list[dict]:
    """Each figure of the statement that the source does not state anywhere (figures): what it is, and the source's
    figure of the same kind where the statement's words around it sit in the source (figure_place), with the words
    after it, where there is one (a conflict): {"figure", "kind", "source_figure" | None, "source_says" | None,
    "sentence"}."""
    stated = figures(source)
    missing = [f for f in figures(statement) if not any(same_figure(f, s) for s in stated)]
    out = []
    for figure in missing:
        sentence, rival = figure_place(figure, statement, source)
        entry = {"figure": figure.text, "kind": figure.kind, "source_figure": None, "source_says": None}
        if rival is not None:
            words = sentence[rival.end :].split()[:CONTEXT_WORDS]
            while words and _bare(words[-1]) in _STOP:  # "12 million dollar budget", not "... budget for"
                words.pop()
            after = " ".join(words).rstrip(".,;:")
            glue = "" if after[:1] in (",", ";", ":", ".") else " "
            entry.update(source_figure=rival.text, source_says=f"{rival.text}{glue}{after}".strip())
        out.append(dict(entry, sentence=sentence))
    return out


def figure_place(figure: Figure, statement: str, source: str) -> tuple[str, Figure | None]:
    """Where a statement's figure sits in the source: the source sentence sharing most content words with the
    figure's neighbourhood in the statement (CONTEXT_WORDS words either side; the whole statement breaks ties: a
    summary sentence may join facts from several source sentences), and in it the source's figure of the same kind
    that the statement's figure is most likely written for: the same unit after it ("million pounds"), the same
    scale, the nearest value."""
    before = statement[: figure.start].split()[-CONTEXT_WORDS:]
    after = statement[figure.end :].split()[:CONTEXT_WORDS]
    near, whole = content_words(" ".join(before + after)), content_words(statement)
    pieces = sentences(source) or [source]
    sentence = max(
        pieces, key=lambda s: (len(near & content_words(s)), len(whole & content_words(s)), -pieces.index(s))
    )
    unit, measures = content_words(" ".join(after[:2])), unit_of(statement[figure.end :])

    def fit(s: Figure, sentence: str = sentence) -> tuple:
        """The same unit after it; then the most words around it shared with the statement's words around its
        figure ("$38 million for the bridge" for "$58M for the bridge", not the "$48 million bond issue" beside
        it, although 48 is nearer 58); then the same scale; then the nearest value."""
        unit_fits = len(unit & content_words(" ".join(sentence[s.end :].split()[:2])))
        around = sentence[: s.start].split()[-CONTEXT_WORDS:] + sentence[s.end :].split()[:CONTEXT_WORDS]
        shared = len(near & content_words(" ".join(around)) - {w for w in near if w.isdigit()})
        if isinstance(s.value, str) or isinstance(figure.value, str):
            return (unit_fits, shared, 0, 0.0)
        scale = (abs(s.value) >= 1e3) == (abs(figure.value) >= 1e3) and (abs(s.value) >= 1e6) == (
            abs(figure.value) >= 1e6
        )
        return (unit_fits, shared, int(scale), -abs(s.value - figure.value) / max(abs(figure.value), 1))

    def of_its_kind(text: str) -> list[Figure]:
        found = [s for s in figures(text) if _kind_of(s) == _kind_of(figure)]
        return [s for s in found if not _measure_other_things(measures, unit_of(text[s.end :]))]

    rivals = of_its_kind(sentence)
    if not rivals and measures is not None:
        # A figure with a unit ("220 °C") whose sentence states none of that measure ("Bake for 40 minutes"): the
        # source's figure of the same measure in another sentence ("Heat the oven to 180 °C") is the one it stands
        # for; the figure itself is one the source states nowhere, so a copied figure is never accused.
        placed = [(s, piece) for piece in pieces for s in of_its_kind(piece) if unit_of(piece[s.end :]) == measures]
        if placed:
            rival, sentence = max(placed, key=lambda found: fit(found[0], found[1]))
            return sentence, rival
    if not rivals:
        # The sentence after names what this one said of its subject ("Marta Ruiz won ... . She is 17 years old"):
        # a figure of the kind there, of the same scale, is the one the statement's figure stands for. Only the next
        # sentence, and only a figure the source states nowhere reaches here, so a copied figure is never accused.
        at = pieces.index(sentence)
        follow = pieces[at + 1] if at + 1 < len(pieces) else ""
        near_rivals = [s for s in of_its_kind(follow) if _scale_fits(s, figure)]
        if near_rivals:
            return follow, max(near_rivals, key=lambda s: fit(s, follow))  # fit reads the words around each in it
    return sentence, (max(rivals, key=fit) if rivals else None)


def unit_of(text_after: str) -> str | None:
    """What the word right after a figure measures (UNITS: "temperature" for "°C" or "degrees"), or None: no unit."""
    words = text_after.split()[:1]
    return UNITS.get(words[0].strip(".,;:!?\"'()").lower()) if words else None


def _measure_other_things(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a != b


def _scale_fits(a: Figure, b: Figure) -> bool:
    """Two figures of one order of scale (under a thousand, thousands, millions and up), or two date words."""
    if isinstance(a.value, str) or isinstance(b.value, str):
        return isinstance(a.value, str) and isinstance(b.value, str)
    return (abs(a.value) >= 1e3) == (abs(b.value) >= 1e3) and (abs(a.value) >= 1e6) == (abs(b.value) >= 1e6)


def figure_note(entry: dict) -> str:
    """One figure's evidence as a reader reads it: "3,870: the source says 1,870 vacant posts", or "3,870: the
    source states no such figure"."""
    if entry.get("source_says"):
        return f"{entry['figure']}: the source says {entry['source_says']}"
    return f"{entry['figure']}: the source states no such figure"
