"""The stage cache: every successful stage output, in SQLite, keyed by what determines it.

Key: the judge's identity (a hash of its weights' metadata and config) and dtype, its runtime where another engine
than ours ran it (vLLM), PROMPT_VERSION, and the request's own key (StageRequest.key: its messages, schema, token
cap, verdict choice and continuation). Not the sample id nor the stage: the same source scored with two summaries
asks the same "questions" request, so the second summary is judged on the first one's questions (fairer, and
free). A re-run with the same judge recomputes nothing.

Failed stages are never stored, so a re-run tries them again. Several processes may share one file: SQLite in WAL
mode, a long busy timeout, and INSERT OR IGNORE (greedy decoding makes any two writers' values the same). The cache
only saves time, so nothing it meets ends a run (StageCache: a warning, and the run goes on without it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Sequence
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


class CacheWarning(UserWarning):
    """The stage cache cannot be used as it is (full disk, corrupt file, no permission, locked): the run goes on."""


# SQLite's words for a file that is not a database, or a damaged one: moved aside, a fresh cache made in its place
CORRUPT = ("file is not a database", "malformed", "not a database")


class StageCache:
    """The cache of stage outputs in one SQLite file. It only saves time, so it never ends a run: a file that cannot
    be opened, read or written (full disk, corrupt, a folder the user cannot write, locked by another process past
    the busy timeout) gives one warning naming the file and what to do, and the run goes on without it, or reading
    it only where reading still works. A corrupt file is moved aside (never deleted) and a fresh one made."""

    def __init__(self, path: str | os.PathLike, *, warn: Callable[[str], None] | None = None, timeout: float = 120):
        self.path = Path(path)
        self.warn = warn or (lambda message: warnings.warn(message, CacheWarning, stacklevel=3))
        self.readable = self.writable = False
        self._lock = threading.Lock()
        self._db = None
        self._warned: set[str] = set()
        try:
            self._db = self._open(timeout)
        except (sqlite3.Error, OSError) as exc:
            if not any(word in str(exc) for word in CORRUPT):
                self._off("cannot be opened", exc)
                return
            aside = self._move_aside()
            try:
                self._db = self._open(timeout)
            except (sqlite3.Error, OSError) as again:
                self._off(f"was corrupt (moved aside to {aside}) and a new one cannot be made", again)
                return
            self._say(
                "corrupt",
                f"{self.path} was not a readable stage cache ({exc}): moved aside to {aside}, and a "
                f"new one started; delete the old file once you no longer need it",
            )
        self.readable = self.writable = True

    def _open(self, timeout: float):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS stages (key TEXT PRIMARY KEY, stage TEXT NOT NULL, "
                "judge TEXT NOT NULL, payload TEXT NOT NULL)"
            )
            db.execute("SELECT COUNT(*) FROM stages LIMIT 1").fetchone()  # a damaged file fails here, not mid-run
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):  # the damaged file's journal belongs to it, not to the new one
            extra = Path(f"{self.path}{suffix}")
            if extra.exists():
                os.replace(extra, Path(f"{aside}{suffix}"))
        return aside

    def _say(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self.warn(message)

    def _off(self, what: str, exc: BaseException) -> None:
        """No reading nor writing from here on: one warning, and the run goes on without the cache."""
        self.readable = self.writable = False
        self._say(
            "off",
            f"the stage cache {self.path} {what} ({exc}); the run goes on without it (every stage computed, none "
            f"stored): free space or mend the file's folder, or pass --cache PATH elsewhere or --no-cache",
        )

    @staticmethod
    def key(judge: dict, request: StageRequest) -> str:
        material = [CACHE_FORMAT, judge.get("identity"), judge.get("dtype"), PROMPT_VERSION, request.key]
        # Another runtime's answers (vLLM's) differ in the last digits: kept apart. Ours are keyed as they always were.
        if judge.get("runtime") not in (None, "local"):
            material.append(judge["runtime"])
        return hashlib.sha256(
            json.dumps(material, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
        ).hexdigest()

    def get(self, keys: Sequence[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        if not self.readable:
            return found
        keys = list(dict.fromkeys(keys))
        with self._lock:
            try:
                for at in range(0, len(keys), 500):  # SQLite caps the parameters of one statement
                    part = keys[at : at + 500]
                    rows = self._db.execute(
                        f"SELECT key, payload FROM stages WHERE key IN ({','.join('?' * len(part))})", part
                    ).fetchall()
                    found.update((k, json.loads(p)) for k, p in rows)
            except (sqlite3.Error, OSError, ValueError) as exc:
                self._off("cannot be read", exc)
                return {}
        return found

    def put(self, items: list[tuple[str, StageResult]], judge: dict) -> None:
        if not items or not self.writable:
            return
        rows = [
            (key, r.request.stage, str(judge.get("identity")), json.dumps(_payload(r), ensure_ascii=False))
            for key, r in items
        ]
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany("INSERT OR IGNORE INTO stages VALUES (?, ?, ?, ?)", rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except (sqlite3.Error, OSError) as exc:
                # Reading may still work (a full disk, a lock held past the timeout): keep reading, stop storing
                self.writable = False
                self._say(
                    "read-only",
                    f"the stage cache {self.path} cannot be written ({exc}); the run goes on reading it, storing no "
                    f"new stages: free space, or pass --cache PATH elsewhere or --no-cache",
                )

    def __len__(self) -> int:
        if not self.readable:
            return 0
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM stages").fetchone()[0]

    def close(self) -> None:
        if self._db is not None:
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
    what succeeds. Counts `hits` (answered from the file), `twins` (the same request as one in flight: computed
    once, answered from it, with or without a file) and `computed` (the requests that reached the engine)."""

    def __init__(self, inner, cache: StageCache):
        super().__init__(inner)
        self.cache = cache
        self.hits = self.twins = self.computed = 0

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
                self.hits += 1
            elif first[key] == i:
                results.append(computed[key])
            else:  # the same request asked twice in one wave (two summaries of one source): computed once
                results.append(replace(computed[key], request=request, cached=True))
                self.twins += 1
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
            self.layer.twins += 1
            self.outer.give(other, replace(result, request=request, cached=True))
