"""ScriptedEngine: replies with queued JSON per stage and records every request.

For tests of metric arithmetic and pipelines, and for examples: the replies are fixed, not random, so an
arithmetic test can fail. It validates each reply against the request's schema exactly as the real engine
does, so a scripted reply that breaks the schema becomes a failed stage, as a real one would.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.stages import StageRequest, StageResult, cap_error
from offline_sumscore.engine import Engine


class Truncated(str):
    """A scripted reply that stops at the token cap: the stage fails as a real one that ran out of room does."""


class Raises(str):
    """A scripted reply that makes the whole run() call raise, as a device or model error would."""


class ScriptExhausted(BaseException):
    """A request came for which no reply was queued: the script is wrong, not the judge. A BaseException, as
    KeyboardInterrupt is, so that no layer that records and retries a failing engine call takes it for the judge's
    failure: it ends the run where it happened."""


class ScriptedEngine(Engine):
    """context_tokens: a context length in words, so tests can make a long source need chunking (None: no limit)."""

    def __init__(self, replies: dict[str, list[Any]] | None = None, *, context_tokens: int | None = None):
        self.context_tokens = context_tokens
        self.queues: dict[str, deque] = defaultdict(deque)
        self.requests: list[StageRequest] = []
        self.calls: list[int] = []  # requests per run() call: one call per wave shows batching across samples
        for stage, items in (replies or {}).items():
            self.enqueue(stage, *items)

    def enqueue(self, stage: str, *replies: Any) -> ScriptedEngine:
        """Queue replies for a stage: dicts (dumped to JSON) or raw strings (used as the model's text: "Yes", "No" or
        "No\nReason: ..." for a yes-no verdict; a likelihood reply is {"mean_logprob": -1.5, "tokens": 6})."""
        self.queues[stage].extend(r if isinstance(r, str) else json.dumps(r) for r in replies)
        return self

    @staticmethod
    def words(request: StageRequest) -> int:
        return sum(len(m["content"].split()) for m in request.messages)

    def spare_tokens(self, request: StageRequest) -> int | None:
        return None if self.context_tokens is None else self.context_tokens - self.words(request)

    def describe(self) -> dict:
        return {"engine": "scripted", "judge": {"name": "scripted", "identity": "scripted"}}

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        self.calls.append(len(requests))
        results = []
        for req in requests:
            self.requests.append(req)
            if not self.queues[req.stage]:
                raise ScriptExhausted(f"ScriptedEngine has no reply queued for stage {req.stage!r}")
            text = self.queues[req.stage].popleft()
            if isinstance(text, Raises):
                raise RuntimeError(str(text))
            prompt = "\n".join(m["content"] for m in req.messages)
            res = StageResult(
                request=req,
                value=None,
                raw_output=text,
                prompt=prompt,
                tokens_in=self.words(req),
                tokens_out=len(text.split()),
                cap=req.max_new_tokens or 100,
            )
            if self.context_tokens is not None and self.words(req) > self.context_tokens:
                res.error_kind, res.error = Failure.CONTEXT, "prompt longer than the scripted context"
            elif isinstance(text, Truncated):  # cut by its cap whatever it holds, as a capped reply is
                res.error_kind, res.error = Failure.CAP, cap_error(res.cap)
            else:
                res.read_reply(text)
            results.append(res)
        return results
