"""Input rows as the scorers take them: Sample (a row to judge) and BadRow (a row that cannot be), the checks every
reader applies to a row's texts, and the hashes that pair rows across runs. Reading files is io.inputs' job.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.core.errors import InputError

# C0 and C1 control characters other than tab, newline and carriage return: in judged text they are nearly always
# corruption (a NUL from a binary file, an escape sequence from a terminal log), and some tokenizers drop them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Undecodable bytes survive decoding with errors="surrogateescape" as lone surrogates U+DC80..U+DCFF.
UNDECODABLE = re.compile(r"[\udc80-\udcff]")


@dataclass(frozen=True)
class Sample:
    id: str
    source: str
    summary: str
    questions: tuple[str, ...] | None = None  # user-supplied questions: skip question generation
    key_facts: tuple[str, ...] | None = None  # user-supplied statements (FineSurE's key facts) to check coverage by
    line: int | None = None
    key: str = ""  # resume key: "id:<id>" when the row names an id, else "line:<n>"
    input_hash: str = ""  # hash of the row's judged content: a resumed run checks it against OUTPUT's row
    given_id: Any = None  # the id as the input gave it (a JSON string, number or boolean), None if it gave none
    doc_id: str | None = None  # the input's doc_id field, if any: kept in OUTPUT for `sumscore compare --by doc_id`
    # Every field of the input row as the file gave it (the user's doc, model, ...): OUTPUT keeps them under "input",
    # apart from the result's own fields. Not judged, so not compared or hashed.
    columns: dict | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class BadRow:
    """An input row that cannot be scored. It becomes a failed row in OUTPUT; the run goes on."""

    id: str
    line: int | None
    key: str
    input_hash: str
    error: InputError
    given_id: Any = None  # as for Sample: what OUTPUT's row shows as its id
    columns: dict | None = field(default=None, compare=False, hash=False, repr=False)  # as for Sample


_SAME = object()  # checked_sample's errors name the row's own id


def checked_sample(
    row_id: str,
    source: Any,
    summary: Any,
    *,
    questions: Any = None,
    key_facts: Any = None,
    source_field: str = "source",
    summary_field: str = "summary",
    line: int | None = None,
    path: str | None = None,
    error_id: Any = _SAME,
    python: bool = False,
) -> Sample:
    """The one way a Sample is made from unchecked text (a file's row, a DataFrame's, a Ray dataset's, a Python
    call): its texts checked by check_text, an InputError naming the row and field where one is missing or not text,
    or where the source is empty. An empty summary is a row to score (it scores 0: is_empty_summary), not a bad
    one. error_id: the id an error names (default row_id; None where the caller gave no id, so that no made-up id is
    shown); python: the texts came from a Python call (a missing one is None, not null)."""
    where = {"line": line, "path": path, "row_id": row_id if error_id is _SAME else error_id, "python": python}
    return Sample(
        id=row_id,
        source=check_text(source, source_field, **where),
        summary=check_text(summary, summary_field, may_be_empty=True, **where),
        questions=tuple(questions) if questions is not None else None,
        key_facts=tuple(key_facts) if key_facts is not None else None,
    )


def is_empty_summary(summary: str) -> bool:
    """Whether a summary states nothing (empty or whitespace-only): a system that wrote nothing. Such a summary is
    scored, not failed: it scores 0, as Mastra's scorer gives a summary with no claims 0, so that a comparison of
    systems counts it against the system instead of leaving its document out."""
    return not summary.strip()


def source_hash(source: str) -> str:
    """What OUTPUT rows are paired by in `sumscore compare` when no document field is named: the source's hash."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def content_hash(*parts: Any) -> str:
    return hashlib.sha256(
        json.dumps(parts, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    ).hexdigest()[:16]


def judged_hash(source: Any, summary: Any, questions: Any = None, key_facts: Any = None) -> str:
    """The resume hash of what a row asks to be judged (key facts only where given, so older hashes still hold)."""
    return content_hash(source, summary, questions, *([key_facts] if key_facts is not None else []))


def check_text(
    value: Any,
    field: str,
    *,
    line: int | None = None,
    row_id: str | None = None,
    path: str | None = None,
    python: bool = False,
    may_be_empty: bool = False,
) -> str:
    """value as a text to judge, or an InputError naming the row and field. python: the value came from a Python
    call, so a missing one is None (not JSON's null). may_be_empty: an empty or whitespace-only text is kept (a
    summary's; a source must hold text to judge against)."""

    def bad(rule: str, cause: str) -> InputError:
        return InputError(rule, field=field, line=line, row_id=row_id, path=path, cause=cause)

    if not isinstance(value, str):
        missing = "None" if python else "null"
        raise bad(f"must be a string; got {missing if value is None else type(value).__name__}", "not_a_string")
    if not value.strip() and not may_be_empty:
        raise bad("is empty or whitespace-only; each row needs text to judge", "empty_text")
    if m := UNDECODABLE.search(value):
        raise bad(f"is not valid UTF-8 (byte 0x{ord(m.group()) - 0xDC00:02x} at character {m.start()})", "invalid_utf8")
    if m := _CONTROL.search(value):
        raise bad(
            f"contains control character U+{ord(m.group()):04X} at character {m.start()}; remove it "
            f"(tab, newline and carriage return are allowed)",
            "control_character",
        )
    return value


def as_sample(item: Any, index: int) -> Sample:
    """Accept a Sample, a (source, summary) pair or a dict with source/summary (and id, questions)."""
    if isinstance(item, Sample):
        return item
    if isinstance(item, dict):
        given = item.get("id")
        # An error names the id the caller gave, or the item's position: never an id it did not give.
        return checked_sample(
            str(given if given is not None else index),
            item.get("source"),
            item.get("summary"),
            questions=item.get("questions"),
            key_facts=item.get("key_facts"),
            path=None if given is not None else f"item {index}",
            error_id=str(given) if given is not None else None,
            python=True,
        )
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return checked_sample(str(index), item[0], item[1], path=f"item {index}", error_id=None, python=True)
    raise InputError(
        f"item {index} must be a (source, summary) pair or a dict with source and summary; got {type(item).__name__}"
    )
