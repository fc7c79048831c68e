"""RetryingEngine: a failed stage gets one more try, and its failure is recorded, never turned into a score.

A row that hit its token cap is rerun with twice the cap (the judge may simply need more room: a long claim list);
a call in which the engine itself raised (a model or device error) is rerun once as it was. Any other failure
(output that does not validate, a prompt that leaves no room, out of memory alone) would fail the same way again
under greedy decoding, so it is not retried. The retried result keeps the first attempt's audit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import EngineLayer, Feed, stream_in_waves

RETRIED = (Failure.CAP, Failure.MODEL)


class RetryingEngine(EngineLayer):
    def __init__(self, inner):
        super().__init__(inner)
        self.retries = 0

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        results = self._attempt(requests)
        again = [i for i, r in enumerate(results) if r.error_kind in RETRIED]
        if not again:
            return results
        self.retries += len(again)
        second = self._attempt([second_try(requests[i], results[i]) for i in again])
        for i, result in zip(again, second):
            # The result answers the request as asked (its cache key), whatever cap the retry ran under.
            results[i] = replace(result, request=requests[i], first_attempt=results[i].audit())
        return results

    def stream(self, feed: Feed) -> None:
        """The same rule on a stream: a failed answer goes back in as a second try before the driver sees it. A
        native stream records an engine error in each row it touched (kind "model"), so that is retried too."""
        if not self.streams_natively():
            return stream_in_waves(self, feed)
        self.inner.stream(_RetryFeed(self, feed))

    def _attempt(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        try:
            return self.inner.run(requests)
        except Exception as exc:  # noqa: BLE001 - recorded in every row of the call, then retried once
            message = engine_raised(exc)
            return [
                StageResult(request=r, value=None, raw_output="", error=message, error_kind=Failure.MODEL)
                for r in requests
            ]


def second_try(request: StageRequest, first: StageResult) -> StageRequest:
    """What a failed request is asked again as: with twice the cap if it hit its cap, else as it was."""
    return replace(request, max_new_tokens=2 * first.cap) if first.error_kind == Failure.CAP and first.cap else request


def engine_raised(exc: Exception) -> str:
    """The error recorded in each row of a call in which the engine itself raised (kind "model")."""
    return f"the engine raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class _RetryFeed:
    def __init__(self, layer: RetryingEngine, outer: Feed):
        self.layer, self.outer = layer, outer
        self.again: list[tuple[int, StageRequest]] = []
        self.first: dict[int, tuple[StageRequest, StageResult]] = {}  # ticket -> (the request as asked, attempt 1)

    def take(self) -> list[tuple[int, StageRequest]]:
        ready, self.again = self.again, []
        return ready + self.outer.take()

    def give(self, ticket: int, result: StageResult) -> None:
        if ticket in self.first:
            request, first = self.first.pop(ticket)
            self.outer.give(ticket, replace(result, request=request, first_attempt=first.audit()))
        elif result.error_kind in RETRIED:
            self.layer.retries += 1
            request = result.request
            self.first[ticket] = (request, result)
            self.again.append((ticket, second_try(request, result)))
        else:
            self.outer.give(ticket, result)
