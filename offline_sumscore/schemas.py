"""Pydantic schemas of every judge stage's output: what constrained decoding may produce.

Everything known in advance is in the schema: booleans (or "1"/"0") for verdicts, item counts, and caps on
string lengths so that a degenerate model closes its JSON long before the token cap. The verdict key comes
before the reason key, so a verdict is never conditioned on a rationalisation written first.
Schemas are built by cached factories: one class per parameter set, so each grammar is built once.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Annotated, List, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

_STRICT = ConfigDict(extra="forbid", strict=True)  # strict: "yes" is not a boolean here


def _text(max_chars: int):
    return (str, Field(min_length=1, max_length=max_chars))


@lru_cache(maxsize=None)
def claim_verdict(text_chars: int, reason_chars: int | None) -> type[BaseModel]:
    fields = {"claim": _text(text_chars), "supported": (bool, ...)}
    if reason_chars:
        fields["reason"] = _text(reason_chars)
    return create_model("ClaimVerdict", __config__=_STRICT, **fields)


@lru_cache(maxsize=None)
def claims_list(max_claims: int, text_chars: int, reason_chars: int | None) -> type[BaseModel]:
    """Stage "claims": the summary's atomic claims, each judged against the source."""
    item = claim_verdict(text_chars, reason_chars)
    return create_model("ClaimsVerdictList", __config__=_STRICT,
                        claims=(List[item], Field(min_length=1, max_length=max_claims)))


@lru_cache(maxsize=None)
def questions_list(max_questions: int, text_chars: int) -> type[BaseModel]:
    """Stages "questions" and "ragas_questions": closed questions the source answers yes."""
    return create_model("QuestionList", __config__=_STRICT,
                        questions=(List[Annotated[str, Field(min_length=1, max_length=text_chars)]],
                                   Field(min_length=1, max_length=max_questions)))


@lru_cache(maxsize=None)
def _single_verdict(name: str, key: str, reason_chars: int | None) -> type[BaseModel]:
    fields = {key: (bool, ...)}
    if reason_chars:
        fields["reason"] = _text(reason_chars)
    return create_model(name, __config__=_STRICT, **fields)


def coverage_verdict(reason_chars: int | None) -> type[BaseModel]:
    """Stage "coverage", one request per question: answered, then (optionally) why."""
    return _single_verdict("CoverageVerdict", "answered", reason_chars)


def support_verdict(reason_chars: int | None) -> type[BaseModel]:
    """Stage "support" (long sources), one request per claim and further piece: supported, then why."""
    return _single_verdict("SupportVerdict", "supported", reason_chars)


@lru_cache(maxsize=None)
def keyphrases_list(max_keyphrases: int, text_chars: int) -> type[BaseModel]:
    """Stage "keyphrases" (Ragas-style): named entities, dates, money, percentages of the text."""
    return create_model("KeyphraseList", __config__=_STRICT,
                        keyphrases=(List[Annotated[str, Field(min_length=1, max_length=text_chars)]],
                                    Field(min_length=0, max_length=max_keyphrases)))


@lru_cache(maxsize=None)
def ragas_answer() -> type[BaseModel]:
    """Stage "ragas_answers", one request per question: "1" or "0"."""
    return create_model("RagasAnswer", __config__=_STRICT, answer=(Literal["1", "0"], ...))


def max_json_chars(schema: dict, *, escapes: bool = True) -> int:
    """An upper bound on the length of any JSON document the schema admits, in the compact form the grammar
    emits (llguidance writes ", " and ": " separators). Used to size the token cap so that only a broken
    grammar, never a long-winded model, can reach it. escapes=False counts each string character once (no
    escaping): the longest output a real text gives, used to reserve context room for the output."""
    per_char = 6 if escapes else 1
    defs = schema.get("$defs", {})

    def bound(node: dict) -> int:
        if "$ref" in node:
            return bound(defs[node["$ref"].split("/")[-1]])
        kind = node.get("type")
        if "enum" in node or "const" in node:
            values = node.get("enum", [node.get("const")])
            return max(len(repr(v)) for v in values) + 2
        if kind == "boolean":
            return 5
        if kind == "string":
            # A character may need escaping (\" or \uXXXX): up to 6 chars each.
            return 2 + per_char * node.get("maxLength", 10_000)
        if kind == "array":
            items = node.get("maxItems", 100)
            return 2 + items * (bound(node.get("items", {})) + 2)
        if kind == "object":
            props = node.get("properties", {})
            return 2 + sum(len(k) + 6 + bound(v) for k, v in props.items())
        return 64

    return bound(schema)
