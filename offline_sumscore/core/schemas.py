"""Pydantic schemas of every judge stage's output: what constrained decoding may produce.

Everything known in advance is in the schema: item counts, and caps on string lengths so that a degenerate model
closes its JSON long before the token cap. Verdicts are not JSON: a YesNoVerdict is a plain "Yes" or "No" (then a
reason, when asked), with a grammar of its own, so the verdict comes first and is read from one next-token
distribution; a Likelihood is the judge's log-probability of a given statement, with nothing decoded.
Schemas are built by cached factories: one class per parameter set, so each grammar is built once.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

_STRICT = ConfigDict(extra="forbid", strict=True)  # strict: "yes" is not a boolean here


class TextOutput(BaseModel):
    """An output that is not JSON: it brings its own grammar (Lark syntax, as llguidance reads it) and parser.

    Why verdicts are not JSON: measured on the embedded judge (all 274 FRANK sentences), the same question answered
    as a plain "Yes"/"No" word gave ROC AUC 0.60, and answered through `{"supported": ` 0.32, below chance.
    """

    model_config = _STRICT

    @classmethod
    def lark(cls) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def from_text(cls, text: str) -> TextOutput:  # pragma: no cover - abstract
        raise NotImplementedError


class YesNoVerdict(TextOutput):
    """Stages "support" and "coverage" with yes-no verdicts: "Yes" or "No", then (when asked) a reason on the next
    line. The verdict is the first token, so it is read from one next-token distribution, and the reason, decoded
    after it, can only explain it."""

    verdict: bool
    reason: str | None = None
    reason_chars: ClassVar[int | None] = None

    @classmethod
    def lark(cls) -> str:
        if not cls.reason_chars:
            return 'start: "Yes" | "No"'
        return 'start: ("Yes" | "No") "\\nReason: " /[^\\n]{1,' + str(cls.reason_chars) + "}/"

    @classmethod
    def from_text(cls, text: str) -> YesNoVerdict:
        word, _, rest = text.partition("\n")
        if word not in ("Yes", "No"):
            raise ValueError(f"a verdict must be Yes or No; got {text[:20]!r}")
        # The grammar makes a local judge give the reason it was asked for; a served judge's missing reason costs
        # only the explanation, never the verdict.
        reason = rest[len("Reason: ") :] if rest.startswith("Reason: ") else (rest.strip() or None)
        return cls(verdict=word == "Yes", reason=reason)


@cache
def yes_no_verdict(reason_chars: int | None) -> type[YesNoVerdict]:
    return type(f"YesNoVerdict{reason_chars or ''}", (YesNoVerdict,), {"reason_chars": reason_chars})


class Likelihood(BaseModel):
    """Stages "support" and "coverage" with likelihood verdicts: the judge's mean log-probability per token of a
    statement (the request's continuation) after the prompt. One forward pass, nothing decoded."""

    model_config = _STRICT
    mean_logprob: float
    tokens: int = Field(ge=1)
    # The evidence, token by token, from the same pass (empty where the engine reads none: a scripted judge): each
    # statement token's text and log-probability, and the token the judge expected most there with its own.
    token_texts: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    expected_texts: list[str] = Field(default_factory=list)
    expected_logprobs: list[float] = Field(default_factory=list)


def grammar_of(schema: type[BaseModel]) -> tuple[str, str]:
    """(llguidance grammar format, grammar text) for a stage's output schema."""
    if issubclass(schema, TextOutput):
        return "lark", schema.lark()
    return "json_schema", json.dumps(schema.model_json_schema(), sort_keys=True)


def parse_output(schema: type[BaseModel], text: str) -> BaseModel:
    """The judge's text as the schema's value; ValueError (pydantic's ValidationError is one) when it is not."""
    if issubclass(schema, TextOutput):
        return schema.from_text(text)
    return schema.model_validate_json(text)


@cache
def claims_list(max_claims: int, text_chars: int) -> type[BaseModel]:
    """Stage "claims" (atomic): the summary's claims, drawn from the summary alone. Zero claims is allowed (a summary
    that states nothing checkable scores 0). max_claims is a safety bound, not a cap: a list that reaches it is
    drawn again from smaller parts of the summary, never cut."""
    return _text_list("ClaimList", "claims", text_chars, 0, max_claims)


def _text_list(name: str, field: str, text_chars: int, least: int, most: int) -> type[BaseModel]:
    """A model with one field: a list of least..most non-empty strings of at most text_chars each."""
    items = (list[Annotated[str, Field(min_length=1, max_length=text_chars)]], Field(min_length=least, max_length=most))
    return create_model(name, __config__=_STRICT, **{field: items})


# A closed question, by construction: it opens with an auxiliary verb and ends with its only question mark. Asked
# for "closed questions" in words alone, Qwen2.5-Coder-1.5B-Instruct wrote 5 open questions of 6 on the demo's
# faithful row ("What is the name of the library?"), which a summary can never answer "yes", so a faithful summary
# scored 0.33. The grammar makes an open question impossible to write, for every judge.
# Negated openings ("Didn't ...?") are left out: "yes" to them is ambiguous, and coverage counts the yes-answers.
AUXILIARIES = "Is Are Was Were Do Does Did Has Have Had Will Would Can Could Should Shall May Might Must".split()
CLOSED_QUESTION = r"^(" + "|".join(AUXILIARIES) + r") [^?\n]+\?$"


def is_closed_question(text: str) -> bool:
    """Whether a question is closed as the questions grammar writes them (an auxiliary verb first, one '?' last)."""
    import re

    return re.fullmatch(CLOSED_QUESTION[1:-1], text) is not None


@cache
def questions_list(max_questions: int, text_chars: int, min_questions: int = 1) -> type[BaseModel]:
    """Stages "questions" and "ragas_questions": closed questions the source answers yes, each closed by the grammar
    (CLOSED_QUESTION). min_questions == max_questions asks for exactly that many (DeepEval's n)."""
    item = Annotated[str, Field(min_length=1, max_length=text_chars, pattern=CLOSED_QUESTION)]
    items = (list[item], Field(min_length=min_questions, max_length=max_questions))
    return create_model("QuestionList", __config__=_STRICT, questions=items)


@cache
def keyphrases_list(max_keyphrases: int, text_chars: int) -> type[BaseModel]:
    """Stage "keyphrases" (Ragas-style): named entities, dates, money, percentages of the text."""
    return _text_list("KeyphraseList", "keyphrases", text_chars, 0, max_keyphrases)


@cache
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
