"""Who did what, and to how many: two errors a reader sees at once and a small judge accepts, found from the texts
alone (pure text functions, no model), as core/figures.py finds a changed figure.

- role_check: a name the statement binds to words that the source's aligned sentence binds to another name the
  summary also names: "Reed proposed the plan" where the source says "Ortiz proposed the plan"; "Eastfield beat
  Riverside" where "Riverside beat Eastfield". The swap is read from the words beside the name (up to two after it,
  or before it, up to the next name), absent from the source beside it, while the source holds them beside the
  other name, and the statement's name elsewhere. Names only (capitalised inside a sentence of the source): common
  nouns ("clinics", "pharmacies") and text in lower case are not read. A list ("Brandt and Fischer scored" for
  "Fischer and Brandt scored"), one phrase ("Liverpool winger Raheem Sterling"), a clause closed by a comma or a
  relative clause ("Keith Vaz, who as chairman of the committee led the calls") is no swap.
- quantity_check: a word for all ("every", "all", "each", "entire", "whole") or for most of something where the
  aligned source sentence gives a share of that same thing ("61 percent of residents", "parts of Velden", "14% of
  patients"): the summary states more than the source does.

Each finding names the statement's word, the source's words in its place and the source sentence, so a reader
sees the evidence: {"word", "kind": "role" | "quantity", "source_says", "sentence"}.
"""

from __future__ import annotations

import re

from offline_sumscore.core.figures import MONTHS, UNITS, WEEKDAYS, aligned_sentence, figures
from offline_sumscore.core.source_pieces import sentences

_TOKEN = re.compile(r"[^\W_]+(?:[.,'’&-][^\W_]+)*|[%°£$€&]", re.UNICODE)
# Words that carry no role of their own: a context made only of these says nothing of who did what.
_FUNCTION = frozenset(
    "the a an of and or to in on at for by with from as is was were are be been being has had have it its that this "
    "these those than then their his her our your my we they he she you i not no so but if into onto over under about "
    "after before while also which who whom whose what when where there here will would can could may might should "
    "must do does did up down out off per".split()
)
_RELATIVE = frozenset("who which that whose whom".split())
_JOINS = frozenset("and or & nor".split())  # "Brandt and Fischer": a list, not a role
_DATES = frozenset(MONTHS + WEEKDAYS)  # a changed date is the figure check's (core/figures.py)
_NEAR = 3  # words: a rival this close to the statement's word, with no context between them, is one phrase
# with it ("Liverpool winger Raheem Sterling") or a list ("Fischer and Brandt"), not another role
UNIVERSAL = frozenset("all every each entire whole".split())
MOST = frozenset(["most"])
# Words before a thing that give a share of it, not all of it ("parts of Velden", "some of the homes").
_PARTIAL = frozenset("some part parts half minority majority third quarter fifth".split())  # not "many": "as many"
_SHARE_SPAN = 5  # words before the thing a share of it may stand in ("61 percent of residents")


def _words(text: str) -> list[tuple[str, str]]:
    """(as written, folded) for every word, sign and figure, in order."""
    return [(w, _fold(w)) for w in _TOKEN.findall(text)]


def _gaps(text: str) -> list[str]:
    """What lies between each word and the next (gaps[k]: after word k): a comma there ends a clause."""
    spans = [m.span() for m in _TOKEN.finditer(text)]
    return [text[a[1] : b[0]] for a, b in zip(spans, spans[1:])] + [""]


def _fold(word: str) -> str:
    return word.lower().replace("’", "'")


def _stem(word: str) -> str:
    """A word's form for matching a thing by name: "residents" and "resident", "patients" and "patient"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _is_content(folded: str) -> bool:
    return folded not in _FUNCTION and (folded[0].isalpha() and len(folded) > 1)


def _binds(context: list[str]) -> bool:
    """A context that can say who or what: a word of its own or a unit ("proposed the", "200 g"), not function
    words and figures alone ("for 2027", "in 2027": a paraphrase moves those freely)."""
    return any((_is_content(c) and c not in _DATES) or c in UNITS for c in context)


def names_in(text: str) -> set[str]:
    """The words a text writes as names: capitalised where they do not open a sentence (folded)."""
    found = set()
    for sentence in sentences(text) or [text]:
        for word, key in _words(sentence)[1:]:
            if word[:1].isupper() and _is_content(key):
                found.add(key)
    return found


def _holds(words: list[str], seq: list[str]) -> bool:
    n = len(seq)
    return any(words[i : i + n] == seq for i in range(len(words) - n + 1))


def role_check(statement: str, source: str, summary: str | None = None) -> list[dict]:
    """Words of the statement that the source binds to another role (module docstring): at most one finding per
    statement word, in order."""
    said = _words(statement)
    folded = [f for _, f in said]
    whole = [f for _, f in _words(summary)] if summary is not None else folded
    named = {_stem(f) for f in whole}
    names = names_in(source)
    sentence = aligned_sentence(statement, source)
    src = _words(sentence)
    src_folded = [f for _, f in src]
    src_stems = {_stem(f) for f in src_folded}
    said_gaps, src_gaps = _gaps(statement), _gaps(sentence)
    out: list[dict] = []
    for i, (word, key) in enumerate(said):
        if key not in names or key in _DATES or _stem(key) not in src_stems:
            continue
        if any(f["word"] == word for f in out):
            continue
        for side in ("after", "before"):
            context = folded[i + 1 : i + 3] if side == "after" else folded[max(0, i - 2) : i]
            context = _up_to_a_name(context if side == "after" else context[::-1], names)
            context = context if side == "after" else context[::-1]
            if not context or not _binds(context):  # also "Mesut Ozil": a name beside a name is one name
                continue
            if _listed(folded, said_gaps, i, side):
                continue  # "Henry, Redknapp and Souness agree": the list agrees, not its last name
            ours = [key, *context] if side == "after" else [*context, key]
            if _holds(src_folded, ours):
                continue  # the source says it so
            found = _rival(src, src_gaps, context, side, key, named & names)
            if found is None:
                continue
            at, rival = found
            beside = [p for p, w in enumerate(folded) if _stem(w) == _stem(_fold(rival)) and abs(p - i) <= _NEAR]
            if any(i - len(context) <= p <= i + len(context) for p in beside):
                continue  # the statement holds the rival beside its word: the same phrase, reworded
            theirs = [_fold(rival), *context] if side == "after" else [*context, _fold(rival)]
            if _holds(whole, theirs):
                continue  # the summary binds the rival there too: both said, neither swapped
            start, end = (at, at + 1 + len(context)) if side == "after" else (at - len(context), at + 1)
            while side == "after" and end < len(src) and src_folded[end - 1] in _FUNCTION and end < at + 5:
                end += 1  # "Ortiz proposed the plan", not "Ortiz proposed the"
            span = src[start:end]
            says = " ".join(w for w, _ in span)
            out.append({"word": word, "kind": "role", "source_says": says, "sentence": sentence})
            break
    return out


def _rival(src: list[tuple[str, str]], gaps: list[str], context: list[str], side: str, key: str, named: set[str]):
    """Where the source holds the context beside another name that the summary names too, not within _NEAR words of
    the statement's word and not parted from the context by punctuation ("Ray Parlour, who won three titles with
    Arsenal, has backed": Arsenal closes a clause, it backs no one): (its index, the word), or None."""
    folded = [f for _, f in src]
    n = len(context)
    for j in range(len(folded) - n + 1):
        if folded[j : j + n] != context:
            continue
        at = j - 1 if side == "after" else j + n
        if not 0 <= at < len(folded):
            continue
        rival = folded[at]
        if gaps[min(at, j + n - 1) if side == "after" else j + n - 1].strip():
            continue
        if not _is_content(rival) or rival in _DATES or _stem(rival) == _stem(key) or _stem(rival) not in named:
            continue
        if _listed(folded, gaps, at, side):
            continue
        own = _nearest(folded, key, at)
        across = own is not None and (own > j + n - 1 if side == "after" else own < j)
        if own is not None and abs(own - at) <= _NEAR and not across:
            continue  # "Liverpool winger Raheem Sterling", "Fischer and Brandt": one phrase, or a list
        if own is not None and any(w in _RELATIVE for w in folded[min(own, at) + 1 : max(own, at)]):
            continue  # "Keith Vaz, who as chairman of the Committee led the calls": Vaz led them
        return at, src[at][0]
    return None


def _listed(folded: list[str], gaps: list[str], at: int, side: str) -> bool:
    """Whether the word at `at` is one of a list, on the side away from its context: "and" or a comma among the
    _NEAR words before it (its context after it) or after it (its context before it)."""
    span = range(max(0, at - _NEAR), at) if side == "after" else range(at, min(len(folded) - 1, at + _NEAR))
    words = [folded[k] for k in span if k != at] if side == "after" else [folded[k + 1] for k in span]
    return any(w in _JOINS for w in words) or any("," in gaps[k] for k in span)


def _up_to_a_name(words: list[str], names: set[str]) -> list[str]:
    """The context's words before the first name in it, read outward from the statement's word ("beat" of "beat
    Riverside": the other name is the one the swap moved)."""
    kept = []
    for w in words:
        if w in names:
            break
        kept.append(w)
    return kept


def _nearest(folded: list[str], key: str, at: int) -> int | None:
    """The place of the statement's word nearest the rival in the source sentence, or None."""
    places = [k for k, w in enumerate(folded) if _stem(w) == _stem(key)]
    return min(places, key=lambda k: abs(k - at)) if places else None


def quantity_check(statement: str, source: str) -> list[dict]:
    """Words of the statement for all (or most) of a thing where the aligned source sentence gives a share of that same
    thing and no word for all of it (module docstring)."""
    said = _words(statement)
    out: list[dict] = []
    sentence = src = None
    for i, (word, key) in enumerate(said):
        if key not in UNIVERSAL | MOST:
            continue
        thing = _thing_after(said, i)
        if thing is None:
            continue
        if sentence is None:  # most claims hold no quantity word: the sentence is found only for one that does
            sentence = aligned_sentence(statement, source)
            src = _words(sentence)
        share = _share_of(src, thing, most=key in MOST)
        if share is not None:
            out.append({"word": word, "kind": "quantity", "source_says": share, "sentence": sentence})
    return out


def relation_note(found: dict) -> str:
    """One finding as a reader reads it: "Haddad: the source says 'Silva proposed the merger'"."""
    return f"{found['word']}: the source says '{found['source_says']}'"


def _thing_after(said: list[tuple[str, str]], i: int) -> str | None:
    """The stem of the first content word after a quantity word ("every resident over 65": "resident"), or None
    where a number follows it first ("all 480 adults" counts them; it claims no share)."""
    for _, key in said[i + 1 : i + 5]:
        if key[0].isdigit():
            return None
        if _is_content(key):
            return _stem(key)
    return None


def _share_of(src: list[tuple[str, str]], thing: str, *, most: bool) -> str | None:
    """The source's words for a share of the thing ("61 percent of residents"), where the sentence names the thing
    after a share and never after a word for all of it; for "most", only a share under half ("14% of patients")."""
    folded = [f for _, f in src]
    places = [k for k, f in enumerate(folded) if _stem(f) == thing]
    if not places or any(folded[k] in UNIVERSAL for p in places for k in range(max(0, p - _SHARE_SPAN), p)):
        return None
    for p in places:
        lead = src[max(0, p - _SHARE_SPAN) : p]
        text = " ".join(w for w, _ in lead)
        percents = [f.value for f in figures(text) if f.kind == "percent"]
        if most:
            partial = any(v < 50 for v in percents) or any(f in {"some", "minority"} for _, f in lead)
        else:
            partial = any(v < 100 for v in percents) or any(f in _PARTIAL or f == "most" for _, f in lead)
        if partial:
            start = next(
                k for k, (_, f) in enumerate(lead) if f in _PARTIAL | {"most", "%", "percent"} or f[0].isdigit()
            )
            return " ".join(w for w, _ in lead[start:] + [src[p]])
    return None
