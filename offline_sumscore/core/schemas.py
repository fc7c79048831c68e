"""What every stage's output schema is built from: the strict model config, outputs that bring their own grammar
(TextOutput), a Likelihood (the engines' answer to a likelihood request), a list of texts, and the bound on a JSON
document's length. Each stage's own schema lives with its stage (scorers/stages/<kind>.py).

Everything known in advance is in a schema: item counts, and caps on string lengths so that a degenerate model
closes its JSON long before the token cap. Verdicts are not JSON: a yes-no verdict is a plain "Yes" or "No" (then a
reason, when asked), with a grammar of its own, so the verdict comes first and is read from one next-token
distribution; a Likelihood is the judge's log-probability of a given statement, with nothing decoded.
Schemas are built by cached factories: one class per parameter set, so each grammar is built once.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, create_model

STRICT = ConfigDict(extra="forbid", strict=True)  # strict: "yes" is not a boolean here


class TextOutput(BaseModel):
    """An output that is not JSON: it brings its own grammar (Lark syntax, as llguidance reads it) and parser.

    Why verdicts are not JSON: measured on the embedded judge (all 274 FRANK sentences), the same question answered
    as a plain "Yes"/"No" word gave ROC AUC 0.60, and answered through `{"supported": ` 0.32, below chance.
    """

    model_config = STRICT

    @classmethod
    def lark(cls) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def gbnf(cls) -> str:  # pragma: no cover - abstract
        """The same grammar in GBNF, llama.cpp's grammar syntax (its server's `grammar` field)."""
        raise NotImplementedError

    @classmethod
    def from_text(cls, text: str) -> TextOutput:  # pragma: no cover - abstract
        raise NotImplementedError


class Likelihood(BaseModel):
    """Stages "support" and "coverage" with likelihood verdicts: the judge's mean log-probability per token of a
    statement (the request's continuation) after the prompt. One forward pass, nothing decoded."""

    model_config = STRICT
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


def text_list(name: str, field: str, text_chars: int, least: int, most: int) -> type[BaseModel]:
    """A model with one field: a list of least..most non-empty strings of at most text_chars each."""
    items = (list[Annotated[str, Field(min_length=1, max_length=text_chars)]], Field(min_length=least, max_length=most))
    return create_model(name, __config__=STRICT, **{field: items})


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
