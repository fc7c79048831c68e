"""Engines: what answers stage requests. Holds the contract (Engine), the layers stacked in front of an engine
(retry.py, stage_cache.py), the engines themselves (local/ runs a judge in this process, vllm_engine.py runs it
under vLLM's engine, openai_compatible.py asks a server, scripted.py replays fixed JSON for tests), the judge's
loading (judge.py; whether its weights fit the device: device_fit.py), its CPU linears (cpu_gemm.py,
block_codes.py), its grammars (grammar.py), P(yes) from returned log-probabilities (choice_logprobs.py), and
build.py, the one place where an engine is chosen and made.

May import core/ only. An engine answers StageRequests; it never knows which metric asked.

The contract: run(requests) -> results, same length, same order; and stream(feed), the same work as a stream, in
which the driver hands over work the moment it exists (a sample's next wave as soon as its own answers are in, new
samples while others run) and gets each answer the moment it is ready. An engine that does not stream natively is
streamed in waves (stream_in_waves): one run() call per wave.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from offline_sumscore.core.stages import StageRequest, StageResult


class Feed(Protocol):
    """The driver's side of a stream. take(): the requests ready now, each with a ticket (an int unique in this
    stream), each handed over once; [] when nothing is ready. give(ticket, result): the answer; it may make new
    requests ready. The stream ends when nothing is ready and nothing is being answered."""

    def take(self) -> list[tuple[int, StageRequest]]: ...

    def give(self, ticket: int, result: StageResult) -> None: ...


DEFAULT_IN_FLIGHT = 32  # samples a driver streams at once unless its engine says otherwise: enough to fill a CPU batch


class Engine(ABC):
    """Every method a driver calls on an engine."""

    @abstractmethod
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        """Answer every request; result i answers request i. A failed stage is a result with .error set,
        never an exception (so one bad row cannot lose a batch)."""

    @abstractmethod
    def describe(self) -> dict:
        """What produced the verdicts: judge identity, settings. Stored with every result."""

    def stream(self, feed: Feed) -> None:
        """Answer everything feed will ever hand over (in waves, unless the engine streams natively)."""
        stream_in_waves(self, feed)

    def streams_natively(self) -> bool:
        """Whether stream() answers each request the moment it is ready (else: one run() call per wave)."""
        return False

    def spare_tokens(self, request: StageRequest) -> int | None:
        """Context tokens left once the request's prompt and a realistic output are in (negative: it does not fit);
        None where the engine cannot tell (the source is then never split)."""
        return None

    def in_flight(self) -> int:
        """Samples a driver should keep in flight to fill this engine's batches (a stream's default)."""
        return DEFAULT_IN_FLIGHT

    def gives_likelihoods(self) -> bool:
        """Whether it reads the log-probabilities of a given text (likelihood verdicts); a served judge cannot."""
        return True


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


def run_as_stream(engine: Engine, requests: Sequence[StageRequest]) -> list[StageResult]:
    """run() of an engine that streams natively: the requests as one fixed feed."""
    if not requests:
        return []
    feed = ListFeed(requests)
    engine.stream(feed)
    return feed.results


def stream_in_waves(engine: Engine, feed: Feed) -> None:
    """One run() call per wave: everything ready, answered together; then whatever those answers made ready."""
    while True:
        ready = feed.take()
        if not ready:
            return
        for (ticket, _), result in zip(ready, engine.run([request for _, request in ready])):
            feed.give(ticket, result)


class EngineLayer(Engine):
    """An engine in front of another (one retry of failed stages, the stage cache): it describes itself, sizes
    prompts and streams as the engine it wraps."""

    def __init__(self, inner: Engine):
        self.inner = inner

    def describe(self) -> dict:
        return self.inner.describe()

    def spare_tokens(self, request: StageRequest) -> int | None:
        return self.inner.spare_tokens(request)

    def streams_natively(self) -> bool:
        return self.inner.streams_natively()

    def in_flight(self) -> int:
        return self.inner.in_flight()

    def gives_likelihoods(self) -> bool:
        return self.inner.gives_likelihoods()


__all__ = ["DEFAULT_IN_FLIGHT", "Engine", "EngineLayer", "Feed", "ListFeed", "run_as_stream", "stream_in_waves"]
