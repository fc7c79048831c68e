"""What the engine runs next, decided without touching the model: rows, units, the running batch, admission under
the row cap and the token budget, preemption, and the prefix store.

The executor (executor.py) carries out what this module decides: forward passes, grammar masks, reading verdicts. Every
decision here depends on the requests and the settings alone, never on timing, so a rerun forms the same batches
and gives the same rows.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.core.stages import StageRequest

MIN_SHARED_PREFIX = 16  # tokens: below this, forking a cache costs more than it saves
STORE_BLOCK = 16  # tokens per node of the prefix store's tree


@dataclass
class Row:
    ticket: int  # the feed's ticket for its request
    request: StageRequest
    prompt: str  # rendered with the chat template once, kept for the result's audit
    prompt_ids: list[int]
    cap: int
    calls: int = 1  # requests handed over together with this one (the result's batch_size)
    matcher: object = None
    pending: list[int] = field(default_factory=list)  # tokens to feed in the next forward pass
    position: int = 0  # position id of pending[0]
    out: list[int] = field(default_factory=list)  # every token after the prompt (decoded and forced)
    decoded: int = 0
    forced: int = 0
    choice_probs: list[float] = field(default_factory=list)
    score_from: int | None = None  # likelihood rows: index in prompt_ids of the continuation's first token
    logprob_sum: float = 0.0  # likelihood rows: summed log-probabilities of the continuation's tokens so far
    logprob_count: int = 0
    context: Any = None  # drafts.NgramIndex of prompt_ids + out, built when the row first drafts
    slot: int | None = None  # its KV slot in the running batch
    admitted: int = 0  # its place in the order of admission
    store_after: int = 0  # a prefix of its prompt to put in the prefix store once its next pass has computed it
    siblings: list[Row] = field(default_factory=list)  # rows of its unit waiting for that prefix (it leads them)
    waits_for: Row | None = None  # the row whose next pass computes this row's prefix
    started: float = 0.0
    done: bool = False
    answered: bool = False  # its result has gone back to the feed
    error: str | None = None
    error_kind: str | None = None  # see StageResult.error_kind

    def fail(self, kind: str, message: str) -> None:
        self.done, self.error_kind, self.error = True, kind, message

    def restart(self) -> None:
        """Back to its prompt: a preempted row is rerun from scratch (greedy decoding makes the rerun identical)."""
        self.matcher, self.context, self.store_after, self.siblings, self.waits_for = None, None, 0, [], None
        self.pending, self.out, self.choice_probs = [], [], []
        self.decoded = self.forced = self.position = 0

    @property
    def feed_from(self) -> int:
        """Tokens from here on are read: the last prompt token of a row that generates, the token before the
        continuation of a likelihood row. A shared prefix ends before it."""
        return len(self.prompt_ids) - 1 if self.score_from is None else self.score_from - 1


@dataclass
class Unit:
    rows: list[Row]
    prefix: list[int]  # prefilled once, then forked into one row per request

    @classmethod
    def alone(cls, row: Row) -> Unit:
        """A row with no prefix to share: everything before the tokens it must feed is prefilled as its prefix."""
        return cls([row], row.prompt_ids[: row.feed_from])

    @property
    def cost(self) -> int:  # tokens this unit will hold in the cache, padding aside
        return len(self.prefix) + sum(len(r.prompt_ids) - len(self.prefix) + min(r.cap, 256) for r in self.rows)


@dataclass
class Batch:
    """The running batch: its rows by KV slot (None: a free slot) and the slots (kv_slots.py). A finished row frees
    its slot, which the next admitted row takes; no row ever moves."""

    cache: Any = None  # KVSlots
    rows: list[Row | None] = field(default_factory=list)
    admitted: int = 0  # rows admitted so far: each row's order of admission, for preemption

    @property
    def live(self) -> list[Row]:
        return [r for r in self.rows if r is not None and not r.done]

    @property
    def width(self) -> int:
        return self.cache.width if self.cache is not None else 0

    def place(self, rows: list[Row]) -> None:
        """Slots for new rows (the lowest free first)."""
        slots = self.cache.place(len(rows))
        self.rows += [None] * (self.cache.rows - len(self.rows))
        for row, slot in zip(rows, slots):
            row.slot, row.admitted = slot, self.admitted
            self.admitted += 1
            self.rows[slot] = row

    def release(self, rows: list[Row]) -> None:
        """Free the slots of these rows (finished, or sent back to wait)."""
        self.cache.release([r.slot for r in rows])
        for r in rows:
            self.rows[r.slot], r.slot = None, None
        del self.rows[self.cache.rows :]

    def release_finished(self) -> None:
        done = [r for r in self.rows if r is not None and r.done]
        if done:
            self.release(done)

    def clear(self) -> None:
        self.cache, self.rows = None, []


class Scheduler:
    """Waiting units in arrival order (within one arrival, longest first, so an out-of-memory error comes early);
    schedule() picks those that join the running batch at the next step."""

    def __init__(self, *, max_rows: int, token_budget: int, shared_prefix: bool):
        self.max_rows, self.token_budget, self.shared_prefix = max_rows, token_budget, shared_prefix
        self.waiting: list[Unit] = []

    def add(self, rows: list[Row]) -> None:
        self.waiting.extend(self.units(rows))

    def units(self, rows: list[Row]) -> list[Unit]:
        """Group rows that share a long token prefix, across samples (every summary of one source shares the
        source); everything else is a unit of one. Grouping depends on the prompts alone, never on timing."""
        units = []
        for part in split_by_prefix(rows) if self.shared_prefix else [[r] for r in rows]:
            prefix = common_prefix([r.prompt_ids for r in part], min(r.feed_from for r in part))
            if len(part) == 1 or len(prefix) < MIN_SHARED_PREFIX:
                units.extend(Unit.alone(r) for r in part)
            else:
                # A unit never holds more rows than a batch may: split it, each piece prefilling the prefix.
                units.extend(Unit(part[k : k + self.max_rows], prefix) for k in range(0, len(part), self.max_rows))
        return sorted(units, key=lambda u: u.cost, reverse=True)

    def schedule(self, batch: Batch) -> list[Unit]:
        """The waiting units that fit next to the running batch, in order; the first always goes when the batch is
        empty (it fails alone if it cannot run at all)."""
        rows = len(batch.live)
        used = rows * batch.width
        chosen: list[Unit] = []
        while self.waiting:
            unit = self.waiting[0]
            if (used + unit.cost > self.token_budget or rows + len(unit.rows) > self.max_rows) and (rows or chosen):
                break
            chosen.append(self.waiting.pop(0))
            used += unit.cost
            rows += len(unit.rows)
        return chosen

    def put_back(self, units: list[Unit]) -> None:
        """Units that could not be prefilled now go first next time."""
        self.waiting[:0] = units

    def preempt(self, batch: Batch) -> list[Row]:
        """Out of memory in a step: the newest half of the running rows go back to wait, from scratch. Returns them
        (empty when one row is left: it cannot run even alone)."""
        batch.release_finished()
        live = sorted(batch.live, key=lambda r: r.admitted)
        if len(live) <= 1:
            return []
        sent = live[len(live) // 2 :]
        batch.release(sent)
        for row in sent:
            row.restart()
        self.put_back([Unit.alone(row) for row in sent])
        return sent


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    kv: list  # per layer: (keys, values), each [1, heads, len(tokens), head_dim]
    path: list  # the tree nodes that index it


class PrefixStore:
    """KV caches of prompt prefixes already computed, kept across steps, samples and calls (RadixAttention-style):
    a request whose prompt starts with a stored prefix reuses its keys and values instead of recomputing them (a
    source prefilled for one summary serves every later summary of it, and every stage that opens with it).

    Any stored prefix serves any prompt for the tokens they have in common, since a token's keys and values depend
    only on the tokens up to it. Entries are found through a tree of STORE_BLOCK-token blocks and evicted least
    recently used first, to stay within `budget` tokens. Deterministic: what is stored and found depends only on
    the order of requests."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.exact: dict[tuple[int, ...], int] = {}
        self.root: dict = {}
        self.tokens = 0
        self._next = 0
        self.hits = self.hit_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, tokens: list[int]) -> tuple[list | None, int]:
        """The stored keys and values of the longest prefix of tokens found (sliced to it), and its length."""
        kids, node = self.root, None
        for at in range(0, len(tokens) - STORE_BLOCK + 1, STORE_BLOCK):
            child = kids.get(tuple(tokens[at : at + STORE_BLOCK]))
            if child is None:
                break
            node, kids = child, child["kids"]
        if node is None:
            return None, 0
        key = max(node["ids"])  # the newest entry through the deepest node reached: deterministic
        entry = self.entries[key]
        n = _lcp(entry.tokens, tokens)
        self.entries.move_to_end(key)
        self.hits += 1
        self.hit_tokens += n
        return [(k[:, :, :n], v[:, :, :n]) for k, v in entry.kv], n

    def holds(self, tokens: list[int]) -> bool:
        """Whether exactly this prefix is stored (it becomes the most recently used)."""
        key = self.exact.get(tuple(tokens))
        if key is not None:
            self.entries.move_to_end(key)
        return key is not None

    def add(self, tokens: list[int], kv: list) -> None:
        """Store a prefix's keys and values (copied by the caller: nothing here holds the running batch)."""
        key_tokens = tuple(tokens)
        if len(tokens) < STORE_BLOCK or len(tokens) > self.budget:
            return
        if key_tokens in self.exact:
            self.entries.move_to_end(self.exact[key_tokens])
            return
        key, self._next = self._next, self._next + 1
        path, kids = [], self.root
        for at in range(0, len(tokens) - STORE_BLOCK + 1, STORE_BLOCK):
            node = kids.setdefault(
                key_tokens[at : at + STORE_BLOCK],
                {"ids": set(), "ends": set(), "kids": {}, "up": kids, "block": key_tokens[at : at + STORE_BLOCK]},
            )
            node["ids"].add(key)
            path.append(node)
            kids = node["kids"]
        # An entry this one extends is redundant now: everything it served, this one serves. Such an entry's path
        # ends at a node of this one's.
        for node in path:
            for other in list(node["ends"]):
                old = self.entries[other]
                if len(old.tokens) < len(key_tokens) and key_tokens[: len(old.tokens)] == old.tokens:
                    self._drop(other)
        path[-1]["ends"].add(key)
        self.entries[key] = _Entry(key_tokens, kv, path)
        self.exact[key_tokens] = key
        self.tokens += len(tokens)
        while self.tokens > self.budget:
            self._drop(next(iter(self.entries)))
            self.evictions += 1

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        del self.exact[entry.tokens]
        self.tokens -= len(entry.tokens)
        entry.path[-1]["ends"].discard(key)
        for node in reversed(entry.path):
            node["ids"].discard(key)
            if not node["ids"]:
                del node["up"][node["block"]]


def common_prefix(seqs: list[list[int]], limit: int) -> list[int]:
    """Longest common token prefix, no longer than limit (the tokens every row must still feed come after it)."""
    n = min(min(len(s) for s in seqs) - 1, limit)
    first = seqs[0]
    for k in range(max(n, 0)):
        if any(s[k] != first[k] for s in seqs[1:]):
            return first[:k]
    return first[: max(n, 0)]


def split_by_prefix(rows: list[Row]) -> list[list[Row]]:
    """Rows whose prompts share most of their tokens go together, whichever sample they belong to: rows sorted by
    their tokens, a run of them is a group while the run's common prefix covers at least half of its longest prompt
    (and MIN_SHARED_PREFIX tokens). A shared source or summary qualifies; a shared system message or chat preamble
    alone does not, since a row that shares little is better prefilled whole than fed in a remainder pass, and one
    short prompt must not pull long ones into a group that shares only the preamble. Depends on the prompts only."""
    groups: list[list[Row]] = []
    shared = longest = 0  # of the last group: its common prefix (a sorted run's: first row with each) and longest
    for row in sorted(rows, key=lambda r: r.prompt_ids):
        if groups:
            common = min(shared, _lcp(groups[-1][0].prompt_ids, row.prompt_ids))
            widest = max(longest, len(row.prompt_ids))
            if common >= max(MIN_SHARED_PREFIX, widest // 2):
                groups[-1].append(row)
                shared, longest = common, widest
                continue
        groups.append([row])
        shared = longest = len(row.prompt_ids)
    return groups


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n
