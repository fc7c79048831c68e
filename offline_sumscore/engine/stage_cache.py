"""The stage cache: every successful stage output, in SQLite, keyed by what determines it.

Key: the judge's identity (a hash of its weights' metadata and config) and dtype, its runtime where another engine
than ours ran it (vLLM), PROMPT_VERSION, and the request's own key (StageRequest.key: its messages, schema, token
cap, verdict choice and continuation). Not the sample id nor the stage: the same source scored with two summaries
asks the same "questions" request, so the second summary is judged on the first one's questions (fairer, and
free). A re-run with the same judge recomputes nothing.

Failed stages are never stored, so a re-run tries them again. Several processes may share one file: SQLite in WAL
mode, a long busy timeout, and INSERT OR IGNORE (greedy decoding makes any two writers' values the same).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from offline_sumscore.core.prompts import PROMPT_VERSION
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import EngineLayer, stream_in_waves

CACHE_FORMAT = 2  # bump when the stored payload or the key changes shape (2: the key is StageRequest.key)


def default_cache_path() -> Path:
    root = os.environ.get("OFFLINE_SUMSCORE_CACHE")
    if root:
        return Path(root)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "offline_sumscore" / "stages.sqlite"


class StageCache:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=120, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS stages (key TEXT PRIMARY KEY, stage TEXT NOT NULL, "
            "judge TEXT NOT NULL, payload TEXT NOT NULL)"
        )

    @staticmethod
    def key(judge: dict, request: StageRequest) -> str:
        material = [CACHE_FORMAT, judge.get("identity"), judge.get("dtype"), PROMPT_VERSION, request.key]
        if judge.get("runtime"):  # another runtime's answers (vLLM's) differ in the last digits: kept apart
            material.append(judge["runtime"])
        return hashlib.sha256(
            json.dumps(material, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
        ).hexdigest()

    def get(self, keys: Sequence[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        keys = list(dict.fromkeys(keys))
        with self._lock:
            for at in range(0, len(keys), 500):  # SQLite caps the parameters of one statement
                part = keys[at : at + 500]
                rows = self._db.execute(
                    f"SELECT key, payload FROM stages WHERE key IN ({','.join('?' * len(part))})", part
                ).fetchall()
                found.update((k, json.loads(p)) for k, p in rows)
        return found

    def put(self, items: list[tuple[str, StageResult]], judge: dict) -> None:
        if not items:
            return
        rows = [
            (key, r.request.stage, str(judge.get("identity")), json.dumps(_payload(r), ensure_ascii=False))
            for key, r in items
        ]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR IGNORE INTO stages VALUES (?, ?, ?, ?)", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM stages").fetchone()[0]

    def close(self) -> None:
        self._db.close()


def _payload(r: StageResult) -> dict:
    return {
        "value": r.value.model_dump(mode="json"),
        "raw_output": r.raw_output,
        "prompt": r.prompt,
        "tokens_in": r.tokens_in,
        "tokens_out": r.tokens_out,
        "seconds": r.seconds,
        "batch_size": r.batch_size,
        "cap": r.cap,
        "forced_tokens": r.forced_tokens,
        "decoded_tokens": r.decoded_tokens,
        "choice_probs": r.choice_probs,
        "first_attempt": r.first_attempt,
    }


def _from_payload(request: StageRequest, p: dict) -> StageResult:
    return StageResult(
        request=request,
        value=request.schema.model_validate(p["value"]),
        raw_output=p["raw_output"],
        prompt=p["prompt"],
        tokens_in=p["tokens_in"],
        tokens_out=p["tokens_out"],
        seconds=p["seconds"],
        batch_size=p["batch_size"],
        cap=p["cap"],
        forced_tokens=p["forced_tokens"],
        decoded_tokens=p["decoded_tokens"],
        choice_probs=p["choice_probs"],
        first_attempt=p["first_attempt"],
        cached=True,
    )


class CachedEngine(EngineLayer):
    """Answers what the cache holds, sends the rest (each distinct request once) to the engine below, and stores
    what succeeds. Counts hits and misses; `computed` counts the requests that reached the engine."""

    def __init__(self, inner, cache: StageCache):
        super().__init__(inner)
        self.cache = cache
        self.hits = self.computed = 0

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        judge = self.inner.describe().get("judge", {})
        keys = [StageCache.key(judge, r) for r in requests]
        stored = self.cache.get(keys)
        first: dict[str, int] = {}  # each distinct missing key -> the first request that asks it
        for i, key in enumerate(keys):
            if key not in stored:
                first.setdefault(key, i)
        computed = dict(zip(first, self.inner.run([requests[i] for i in first.values()]))) if first else {}
        self.cache.put([(k, r) for k, r in computed.items() if r.ok], judge)
        self.computed += len(computed)
        results = []
        for i, (request, key) in enumerate(zip(requests, keys)):
            if key in stored:
                results.append(_from_payload(request, stored[key]))
            elif first[key] == i:
                results.append(computed[key])
                continue
            else:  # the same request asked twice in one wave (two summaries of one source): computed once
                results.append(replace(computed[key], request=request, cached=True))
            self.hits += 1
        return results

    def stream(self, feed) -> None:
        """The same on a stream: stored answers are given back at once; of identical requests in flight, only the
        first reaches the engine, and the others get its answer."""
        if not self.streams_natively():
            return stream_in_waves(self, feed)
        wrapped = _CacheFeed(self, feed)
        try:
            self.inner.stream(wrapped)
        finally:
            wrapped.store()


class _CacheFeed:
    def __init__(self, layer: CachedEngine, outer):
        self.layer, self.outer = layer, outer
        self.judge = layer.inner.describe().get("judge", {})
        self.in_flight: dict[str, list[tuple[int, StageRequest]]] = {}  # key -> every ticket waiting on it
        self.key_of: dict[int, str] = {}
        self.unstored: list[tuple[str, StageResult]] = []

    def store(self) -> None:
        """Successes go to the store in one transaction per engine step, not one per answer."""
        self.layer.cache.put(self.unstored, self.judge)
        self.unstored = []

    def take(self) -> list[tuple[int, StageRequest]]:
        self.store()
        while True:
            ready = self.outer.take()
            if not ready:
                return []
            keys = [StageCache.key(self.judge, r) for _, r in ready]
            stored = self.layer.cache.get(keys)
            out = []
            for (ticket, request), key in zip(ready, keys):
                if key in stored:
                    self.layer.hits += 1
                    self.outer.give(ticket, _from_payload(request, stored[key]))
                elif key in self.in_flight:
                    self.in_flight[key].append((ticket, request))
                else:
                    self.in_flight[key], self.key_of[ticket] = [(ticket, request)], key
                    out.append((ticket, request))
            if out:  # else every one was answered from the store, which may have made more ready
                return out

    def give(self, ticket: int, result: StageResult) -> None:
        key = self.key_of.pop(ticket)
        if result.ok:
            self.unstored.append((key, result))
        self.layer.computed += 1
        first, *same = self.in_flight.pop(key)
        self.outer.give(first[0], result)
        for other, request in same:
            self.layer.hits += 1
            self.outer.give(other, replace(result, request=request, cached=True))
