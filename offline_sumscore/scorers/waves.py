"""A plan's wave of requests, each asked under a name and its reply read back by that name, never by its place.

A plan builds a wave in one order and reads it in another place of its code: read by position, a loop reordered on
one side attaches verdicts silently to the wrong claims. So every request of a wave carries an identity
(StageRequest.request_id: the sample, the name it was asked under, its place within that name), every reply carries
its request (StageResult.request), and Replies finds each reply by it: a reply missing, doubled or answering a
request the wave did not hold is an error that names both, whatever order the replies came back in (vLLM v1's
outputs carry their request ids in the same way).
"""

from __future__ import annotations

from dataclasses import replace

from offline_sumscore.core.errors import JudgeOutputError
from offline_sumscore.core.stages import StageRequest, StageResult


class Wave:
    """The requests one plan sends at once, each under a name: a tuple such as ("support", claim, piece)."""

    def __init__(self, sample_id: str):
        self.sample_id = sample_id
        self.requests: list[StageRequest] = []
        self.names: dict[tuple, list[str]] = {}

    def ask(self, name: tuple, requests: StageRequest | list[StageRequest]) -> None:
        if name in self.names:
            raise ValueError(f"a wave asks under {name!r} twice")
        requests = [requests] if isinstance(requests, StageRequest) else list(requests)
        label = "/".join(str(part) for part in name)
        stamped = [replace(r, request_id=f"{self.sample_id}|{label}|{i}") for i, r in enumerate(requests)]
        self.names[name] = [r.request_id for r in stamped]
        self.requests += stamped

    def replies(self, results: list[StageResult]) -> Replies:
        return Replies(self, results)


class Replies:
    """A wave's replies, found by their requests' identities."""

    def __init__(self, wave: Wave, results: list[StageResult]):
        self.wave = wave
        self.by_id: dict[str, StageResult] = {}
        asked = {r.request_id: r for r in wave.requests}
        for result in results:
            rid = result.request.request_id
            if rid not in asked:
                self.mismatch(f"a reply answers {rid or 'a request without an identity'}, which this wave never asked")
            if rid in self.by_id:
                self.mismatch(f"two replies answer {rid}")
            if result.request.stage != asked[rid].stage:
                self.mismatch(f"the reply to {rid} ({asked[rid].stage}) answers a {result.request.stage} request")
            self.by_id[rid] = result
        unanswered = [rid for rid in asked if rid not in self.by_id]
        if unanswered:
            self.mismatch(f"{len(unanswered)} requests have no reply, the first {unanswered[0]}")

    def of(self, name: tuple) -> list[StageResult]:
        """The replies to what was asked under name, in the order it was asked."""
        return [self.by_id[rid] for rid in self.wave.names[name]]

    def one(self, name: tuple) -> StageResult:
        (result,) = self.of(name)
        return result

    def mismatch(self, said: str):
        raise JudgeOutputError(
            f"replies do not match their requests: {said}", stage="wave", sample_id=self.wave.sample_id
        )
