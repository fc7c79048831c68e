"""ScriptedEngine: replies with queued JSON per stage and records every request.

For tests of metric arithmetic and pipelines, and for examples: the replies are fixed, not random, so an
arithmetic test can fail. It validates each reply against the request's schema exactly as the real engine
does, so a scripted reply that breaks the schema becomes a failed stage, as a real one would.
"""
from __future__ import annotations

import json
from collections import defaultdict, deque
from typing import Any, Sequence

from pydantic import ValidationError

from ..stages import StageRequest, StageResult


class ScriptedEngine:
    def __init__(self, replies: dict[str, list[Any]] | None = None):
        self.queues: dict[str, deque] = defaultdict(deque)
        self.requests: list[StageRequest] = []
        self.calls: list[int] = []  # requests per run() call: one call per wave shows batching across samples
        for stage, items in (replies or {}).items():
            self.enqueue(stage, *items)

    def enqueue(self, stage: str, *replies: Any) -> "ScriptedEngine":
        """Queue replies for a stage: dicts (dumped to JSON) or raw strings (used as the model's text)."""
        self.queues[stage].extend(r if isinstance(r, str) else json.dumps(r) for r in replies)
        return self

    def describe(self) -> dict:
        return {"engine": "scripted", "judge": {"name": "scripted", "identity": "scripted"}}

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        self.calls.append(len(requests))
        results = []
        for req in requests:
            self.requests.append(req)
            if not self.queues[req.stage]:
                raise AssertionError(f"ScriptedEngine has no reply queued for stage {req.stage!r}")
            text = self.queues[req.stage].popleft()
            prompt = "\n".join(m["content"] for m in req.messages)
            res = StageResult(request=req, value=None, raw_output=text, prompt=prompt,
                              tokens_in=len(prompt.split()), tokens_out=len(text.split()))
            try:
                res.value = req.schema.model_validate_json(text)
            except ValidationError as exc:
                res.error = f"output does not match the schema: {str(exc).splitlines()[0]}"
            results.append(res)
        return results
