"""Prompt prefixes whose keys and values are already computed, kept across steps, samples and calls.

A request whose prompt starts with a stored prefix reuses its keys and values instead of computing them again: a
source prefilled for one summary serves every later summary of it, and every stage that opens with it. A store of
budget 0 keeps nothing (the ladder's rungs without it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MIN_SHARED_PREFIX = 16  # tokens: below this, forking a cache costs more than it saves
STORE_BLOCK = 16  # tokens per node of the prefix store's tree


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
        self.evictions = 0  # entries dropped to stay within the budget

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
        n = common_length(entry.tokens, tokens)
        self.entries.move_to_end(key)
        return [(k[:, :, :n], v[:, :, :n]) for k, v in entry.kv], n

    def longest(self, prefixes: list[list[int]]) -> list[tuple[list | None, int]]:
        """For each prefix, the keys and values of its longest stored part and that part's length (0: none, or
        shorter than MIN_SHARED_PREFIX)."""
        found = [self.lookup(p) for p in prefixes]
        return [(kv, min(n, len(p)) if n >= MIN_SHARED_PREFIX else 0) for (kv, n), p in zip(found, prefixes)]

    def keep(self, prefix: list[int], slots, slot: int) -> None:
        """Copy the slot's first len(prefix) tokens' keys and values (KVSlots.row_kv) into the store, unless it
        holds them or they could never fit."""
        if MIN_SHARED_PREFIX <= len(prefix) <= self.budget and not self.holds(prefix):
            self.add(prefix, slots.row_kv(slot, len(prefix)))

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


def common_length(a, b) -> int:
    """How many tokens two sequences share from the start."""
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n
