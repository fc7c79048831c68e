"""Prompt prefixes whose keys and values are already computed, kept across steps, samples and calls.

A request whose prompt starts with a stored prefix reuses its keys and values instead of computing them again: a
source prefilled for one summary serves every later summary of it, and every stage that opens with it. A store of
budget 0 keeps nothing (the ladder's rungs without it).

The keys and values lie in one pool of STORE_BLOCK-token blocks, allocated once when the first prefix is stored
(BlockPool): an entry holds the numbers of its blocks, and eviction hands them back. Nothing is allocated or freed
per entry, so a long run's store churns no memory: a store of separately allocated tensors, one per layer per
entry and each of another size, left the allocator's heap more fragmented with every eviction (measured: resident
memory grew by about 20 MiB per 100 rows once the store was full, while the memory in use stayed flat).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from offline_sumscore.engine.local.device_memory import is_out_of_memory

MIN_SHARED_PREFIX = 16  # tokens: below this, forking a cache costs more than it saves
STORE_BLOCK = 16  # tokens per node of the prefix store's tree, and per block of its pool


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    blocks: list[int]  # the pool's blocks holding its keys and values, in order
    path: list  # the tree nodes that index it


class BlockPool:
    """Keys and values in fixed blocks: per layer [kv heads, blocks, STORE_BLOCK, head dim], allocated once and
    uninitialised (on a CPU a block costs memory when first written, so a store that never fills never pays for
    its whole budget). Blocks lie inside each head, so a prefix's blocks gathered in order are already its
    [kv heads, tokens, dim] (one copy to read them, none to reshape)."""

    def __init__(self, blocks: int, kv: list):
        k0 = kv[0][0]
        self.allocate(blocks, len(kv), k0.shape[1], k0.shape[3], k0.dtype, k0.device)

    @classmethod
    def empty(cls, blocks: int, layers: int, kv_heads: int, head_dim: int, dtype, device) -> BlockPool:
        """A pool of this geometry, allocated now (on a bounded device, when the engine is sized)."""
        pool = cls.__new__(cls)
        pool.allocate(blocks, layers, kv_heads, head_dim, dtype, device)
        return pool

    def allocate(self, blocks: int, layers: int, kv_heads: int, head_dim: int, dtype, device) -> None:
        shape = (layers, kv_heads, blocks, STORE_BLOCK, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)
        self.free = list(range(blocks - 1, -1, -1))  # popped from the end: the lowest block first
        self.high_water = 0  # blocks [0, high_water) have been written: on a CPU, the pool's resident part

    def write(self, blocks: list[int], kv: list, n: int) -> None:
        """The first n tokens of kv (per layer (keys, values), each [1, kv heads, >= n, dim]) into these blocks."""
        full = n // STORE_BLOCK
        self.high_water = max(self.high_water, max(blocks) + 1)
        whole = torch.tensor(blocks[:full], device=self.keys.device)
        for layer, pair in enumerate(kv):
            for pool, src in zip((self.keys, self.values), pair):
                src = src[0, :, :n]  # [heads, n, dim]
                if full:
                    pool[layer].index_copy_(1, whole, src[:, : full * STORE_BLOCK].unflatten(1, (full, STORE_BLOCK)))
                if n > full * STORE_BLOCK:
                    pool[layer, :, blocks[full], : n - full * STORE_BLOCK] = src[:, full * STORE_BLOCK :]


class StoredKV:
    """A stored prefix found for a prompt: its first n tokens' keys and values, read from the pool's blocks. Indexed
    by layer it gives (keys, values) [1, kv heads, n, dim]; copy_into writes them into a KV slot."""

    def __init__(self, pool: BlockPool, blocks: list[int], n: int):
        self.pool, self.n = pool, n
        self.blocks = blocks[: -(-n // STORE_BLOCK)]
        self._index = torch.tensor(self.blocks, device=pool.keys.device)

    def _read(self, pool: torch.Tensor, layer: int) -> torch.Tensor:
        """[kv heads, blocks x STORE_BLOCK, dim] of this prefix's blocks in one layer."""
        return pool[layer].index_select(1, self._index).flatten(1, 2)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(self._read(pool, layer)[None, :, : self.n] for pool in (self.pool.keys, self.pool.values))

    def copy_into(self, layer: int, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        """The first n tokens of one layer into a slot's keys and values ([kv heads, columns, dim] each)."""
        for pool, dest in ((self.pool.keys, keys), (self.pool.values, values)):
            dest[:, :n] = self._read(pool, layer)[:, :n]


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
        self.pool: BlockPool | None = None  # made when the first prefix is stored: the model's geometry is known then
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.exact: dict[tuple[int, ...], int] = {}
        self.root: dict = {}
        self.tokens = 0
        self._next = 0
        self.evictions = 0  # entries dropped to stay within the budget
        self.refused = 0  # prefixes not stored for want of memory

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, tokens: list[int]) -> tuple[StoredKV | None, int]:
        """The stored keys and values of the longest prefix of tokens found (StoredKV, sliced to it), and its
        length."""
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
        return StoredKV(self.pool, entry.blocks, n), n

    def longest(self, prefixes: list[list[int]]) -> list[tuple[StoredKV | None, int]]:
        """For each prefix, the keys and values of its longest stored part and that part's length (0: none, or
        shorter than MIN_SHARED_PREFIX)."""
        found = [self.lookup(p) for p in prefixes]
        return [(kv, min(n, len(p)) if n >= MIN_SHARED_PREFIX else 0) for (kv, n), p in zip(found, prefixes)]

    def allocate(self, geometry, dtype, device) -> None:
        """The pool, whole, now: on a bounded device the store's share of the KV budget is allocated when the engine
        is sized, so that storing a prefix in the middle of a step never allocates (capacity.py)."""
        if self.budget and self.pool is None:
            blocks = self.budget // STORE_BLOCK + 1
            self.pool = BlockPool.empty(blocks, geometry.layers, geometry.kv_heads, geometry.head_dim, dtype, device)

    def keep(self, prefix: list[int], slots, slot: int) -> None:
        """Copy the slot's first len(prefix) tokens' keys and values into the store's blocks, unless it holds them or
        they could never fit. Out of memory (a pool made at first use, on a CPU) stores nothing: the store only
        saves work, and a step must not fail for it after its pass is committed."""
        if MIN_SHARED_PREFIX <= len(prefix) <= self.budget and not self.holds(prefix):
            try:
                self.add(prefix, slots.row_views(slot))
            except Exception as exc:  # noqa: BLE001 - anything but running out of memory is a bug, raised
                if not is_out_of_memory(exc):
                    raise
                self.refused += 1

    def holds(self, tokens: list[int]) -> bool:
        """Whether exactly this prefix is stored (it becomes the most recently used)."""
        key = self.exact.get(tuple(tokens))
        if key is not None:
            self.entries.move_to_end(key)
        return key is not None

    def add(self, tokens: list[int], kv: list) -> None:
        """Store a prefix: its keys and values (per layer (keys, values), each [1, kv heads, >= len(tokens), dim])
        are copied into the pool's blocks, the least recently used entries evicted first to make room."""
        key_tokens = tuple(tokens)
        if len(tokens) < STORE_BLOCK or len(tokens) > self.budget:
            return
        if key_tokens in self.exact:
            self.entries.move_to_end(self.exact[key_tokens])
            return
        if self.pool is None:  # the budget in whole blocks, plus one: each entry's last block may be part-filled
            self.pool = BlockPool(self.budget // STORE_BLOCK + 1, kv)
        needed = -(-len(tokens) // STORE_BLOCK)
        while self.entries and (len(self.pool.free) < needed or self.tokens + len(tokens) > self.budget):
            self._drop(next(iter(self.entries)))
            self.evictions += 1
        if len(self.pool.free) < needed:  # part-filled blocks of entries this one makes redundant: none to evict
            return
        blocks = [self.pool.free.pop() for _ in range(needed)]
        try:
            self.pool.write(blocks, kv, len(tokens))
        except BaseException:  # the blocks go back: nothing was stored
            self.pool.free.extend(reversed(blocks))
            raise
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
        self.entries[key] = _Entry(key_tokens, blocks, path)
        self.exact[key_tokens] = key
        self.tokens += len(tokens)

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        del self.exact[entry.tokens]
        self.tokens -= len(entry.tokens)
        self.pool.free.extend(reversed(entry.blocks))
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
