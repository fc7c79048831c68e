"""The engine contract: run(requests) -> results, same length, same order.

An engine answers StageRequests; it never knows which metric asked. TransformersEngine runs a local judge;
ScriptedEngine replays fixed JSON for tests and examples. Both have this one door.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from ..stages import StageRequest, StageResult


class Engine(Protocol):
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        """Answer every request; result i answers request i. A failed stage is a result with .error set,
        never an exception (so one bad row cannot lose a batch)."""
        ...

    def describe(self) -> dict:
        """What produced the verdicts: judge identity, settings. Stored with every result."""
        ...


class EngineLayer:
    """An engine in front of another (one retry of failed stages, the stage cache): it describes itself, and sizes
    prompts, as the engine it wraps."""

    def __init__(self, inner: Engine):
        self.inner = inner

    def describe(self) -> dict:
        return self.inner.describe()

    def spare_tokens(self, request: StageRequest) -> int | None:
        spare = getattr(self.inner, "spare_tokens", None)
        return spare(request) if spare else None


__all__ = ["Engine", "EngineLayer"]
