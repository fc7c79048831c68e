"""The engine contract: run(requests) -> results, same length, same order; and stream(feed), the same work as a
stream.

An engine answers StageRequests; it never knows which metric asked. TransformersEngine runs a local judge;
ScriptedEngine replays fixed JSON for tests and examples; ServedEngine asks a server. All have run(). A stream lets
the driver hand over work the moment it exists (a sample's next wave as soon as its own answers are in, new samples
while others run) and get each answer the moment it is ready: TransformersEngine streams natively; any other engine
is streamed in waves (stream_in_waves), which is exactly the old behaviour of one run() call per wave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from offline_sumscore.core.stages import StageRequest, StageResult


class Engine(Protocol):
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        """Answer every request; result i answers request i. A failed stage is a result with .error set,
        never an exception (so one bad row cannot lose a batch)."""
        ...

    def describe(self) -> dict:
        """What produced the verdicts: judge identity, settings. Stored with every result."""
        ...


class Feed(Protocol):
    """The driver's side of a stream. take(): the requests ready now, each with a ticket (an int unique in this
    stream), each handed over once; [] when nothing is ready. give(ticket, result): the answer; it may make new
    requests ready. The stream ends when nothing is ready and nothing is being answered."""

    def take(self) -> list[tuple[int, StageRequest]]: ...

    def give(self, ticket: int, result: StageResult) -> None: ...


class ListFeed:
    """A fixed list of requests as a feed: run() on top of stream()."""

    def __init__(self, requests: Sequence[StageRequest]):
        self.requests, self.results = list(requests), [None] * len(requests)
        self._taken = False

    def take(self) -> list[tuple[int, StageRequest]]:
        if self._taken:
            return []
        self._taken = True
        return list(enumerate(self.requests))

    def give(self, ticket: int, result: StageResult) -> None:
        self.results[ticket] = result


def streams(engine) -> bool:
    """Whether engine answers a stream natively (else: in waves)."""
    native = getattr(engine, "streams_natively", None)
    return bool(native() if callable(native) else native)


def stream(engine, feed: Feed) -> None:
    """Answer everything feed will ever hand over."""
    if streams(engine):
        engine.stream(feed)
    else:
        stream_in_waves(engine, feed)


def stream_in_waves(engine, feed: Feed) -> None:
    """One run() call per wave: everything ready, answered together; then whatever those answers made ready."""
    while True:
        ready = feed.take()
        if not ready:
            return
        for (ticket, _), result in zip(ready, engine.run([request for _, request in ready])):
            feed.give(ticket, result)


class EngineLayer:
    """An engine in front of another (one retry of failed stages, the stage cache): it describes itself, and sizes
    prompts, as the engine it wraps, and streams natively when that engine does."""

    def __init__(self, inner: Engine):
        self.inner = inner

    def describe(self) -> dict:
        return self.inner.describe()

    def spare_tokens(self, request: StageRequest) -> int | None:
        spare = getattr(self.inner, "spare_tokens", None)
        return spare(request) if spare else None

    def streams_natively(self) -> bool:
        return streams(self.inner)


__all__ = ["Engine", "EngineLayer", "Feed", "ListFeed", "stream", "stream_in_waves", "streams"]
