"""The only types that cross between scorers and engines.

A scorer turns samples into StageRequests; an engine answers each with a StageResult that carries its request, and
the scorer reads each reply by its request's identity (scorers/waves.py).
The engine never knows which metric asked; the scorer never sees a tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import BaseModel

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.schemas import Likelihood, grammar_of, parse_output


@dataclass(frozen=True)
class StageRequest:
    sample_id: str
    stage: str  # "claims", "questions", "support", "coverage", "keyphrases", "ragas_questions", "ragas_answers"
    messages: tuple[dict, ...]  # chat messages; the engine applies the judge's chat template
    schema: type[BaseModel]  # what the output must validate against (schemas.TextOutput: a grammar of its own)
    max_new_tokens: int | None = None  # None: the engine sizes the cap from the schema
    # The first characters of the yes and the no token where the output holds a closed-choice verdict:
    # ("Y", "N") for a YesNoVerdict, ("1", "0") for Ragas's answers. The engine reads P(yes) there.
    verdict_choice: tuple[str, str] | None = None
    # A likelihood request: nothing is generated; the engine scores this text as the start of the judge's reply
    # and answers with schemas.Likelihood (mean log-probability per token).
    continuation: str | None = None
    # Which request of its plan's wave this is (scorers/waves.py): its reply is read back by it, never by its place.
    # Not part of key: identical requests are still merged and cached as one.
    request_id: str = ""

    @cached_property  # cache key and output sizing; computed once per request
    def schema_json(self) -> str:
        return json.dumps(self.schema.model_json_schema(), sort_keys=True)

    @cached_property
    def key(self) -> str:
        """What the answer depends on, as one string: the messages, the schema, the cap, the verdict choice and
        the continuation; not which sample or stage asked. Identical requests in flight are merged on it (the
        local engine, the stage cache), and the stage cache stores answers under it with the judge's identity."""
        material = [list(self.messages), self.schema_json, self.max_new_tokens, self.verdict_choice, self.continuation]
        return json.dumps(material, sort_keys=True, ensure_ascii=False)

    @cached_property
    def grammar(self) -> tuple[str, str]:
        """(format, text) of the grammar that constrains the output: the JSON schema, or a TextOutput's own."""
        return grammar_of(self.schema)


@dataclass
class StageResult:
    request: StageRequest
    value: BaseModel | None  # None when the stage failed
    raw_output: str  # the text the model produced, kept for audit
    prompt: str = ""  # the prompt as rendered with the chat template
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0  # this row's wall time, from admission to the batch until it finished
    batch_size: int = 1  # requests in the same engine call
    error: str | None = None
    # Why it failed, for retries and counts: "cap" (token cap hit before the JSON closed), "schema" (output does
    # not validate), "context" (the prompt leaves no room), "memory" (out of memory even alone), "model" (the
    # engine raised).
    error_kind: str | None = None  # an errors.Failure constant
    cap: int = 0  # the token cap this attempt ran under
    cached: bool = False  # answered from the stage cache (or by an identical request in the same wave)
    first_attempt: dict | None = None  # a retried stage keeps its failed first attempt's audit here
    forced_tokens: int = 0  # of tokens_out: fixed by the grammar, inserted without decoding
    decoded_tokens: int = 0  # of tokens_out: picked from the model's distribution
    choice_probs: list[float] = field(default_factory=list)  # P(yes) at each closed-choice verdict, in order

    @property
    def ok(self) -> bool:
        return self.error is None and self.value is not None

    def read_reply(self, text: str, *, capped: bool = False, parse: str | None = None) -> StageResult:
        """The one reading of a judge's reply, every engine's: text kept as raw_output, and value parsed under the
        request's schema (from `parse`, where an engine first undoes a server's wrapping of it, else from text).
        A reply that does not parse fails: as "cap" where the token cap cut it (capped), else as "schema", each in
        one wording. Returns self."""
        self.raw_output = text
        try:
            self.value = parse_output(self.request.schema, text if parse is None else parse)
        except ValueError as exc:  # pydantic's ValidationError and a JSON error are ValueErrors
            self.value = None
            if capped:
                self.error_kind, self.error = Failure.CAP, cap_error(self.cap)
            else:
                self.error_kind = Failure.SCHEMA
                self.error = f"output does not match the schema: {str(exc).splitlines()[0]}; raw output kept"
        return self

    def audit(self) -> dict[str, Any]:
        """What a user needs to audit this stage: prompt, raw output, tokens, time, error; for a likelihood stage,
        its evidence token by token (each statement token's log-probability, and the token the judge expected most
        there with its own)."""
        audit = {
            "prompt": self.prompt,
            "raw_output": self.raw_output,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "forced_tokens": self.forced_tokens,
            "decoded_tokens": self.decoded_tokens,
            "p_yes": [round(p, 6) for p in self.choice_probs],
            "seconds": round(self.seconds, 4),
            "batch_size": self.batch_size,
            "cap": self.cap,
            "cached": self.cached,
            "error": self.error,
            "error_kind": self.error_kind,
            "first_attempt": self.first_attempt,
        }
        if isinstance(self.value, Likelihood) and self.value.token_logprobs:
            v = self.value
            audit["evidence"] = {
                "tokens": v.token_texts,
                "logprobs": [round(x, 3) for x in v.token_logprobs],
                "expected": v.expected_texts,
                "expected_logprobs": [round(x, 3) for x in v.expected_logprobs],
            }
        return audit


def cap_error(cap: int) -> str:
    """The one wording of a stage whose output reached its token cap before it closed."""
    return f"hit the {cap}-token cap before the output closed; raw output kept"
