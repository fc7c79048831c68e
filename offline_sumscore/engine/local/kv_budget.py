"""The keys and values one engine holds at once on a device of bounded memory, in tokens: what capacity.py sizes and
every slot set claims from (kv_slots.py) before it allocates."""

from __future__ import annotations

import torch


class KVBudgetExceeded(torch.OutOfMemoryError):
    """Keys and values that would take the slots past the engine's KV budget: refused before any memory is touched,
    and handled as the device's own out-of-memory error is (memory.py)."""


class KVBudget:
    """The running batch's slots and a likelihood pack's claim their shapes from it before they allocate, and give
    them back when they free them.

    A slot set is laid out again one buffer at a time (kv_slots.py), so while it changes it holds the larger of its
    old and new sets and one buffer more. `usable` keeps that buffer spare for any set within it: no set the budget
    admitted can ever be stuck, unable to change for want of the memory it holds itself."""

    def __init__(self, usable: int, bytes_per_token: int, buffers: int):
        """usable: what slot sets hold at most, all together; buffers: per slot set (keys and values of every
        layer). The budget is that and one buffer of it more."""
        self.usable, self.bytes_per_token, self.buffers = usable, bytes_per_token, buffers
        self.tokens = usable + -(-usable // buffers)
        self.held: dict[int, int] = {}  # id of a slot set -> tokens its buffers hold

    @classmethod
    def holding(cls, usable: int, geometry) -> KVBudget:
        """A budget whose slot sets hold `usable` tokens of a model of this KVGeometry."""
        return cls(usable, geometry.bytes_per_token, 2 * geometry.layers)

    @staticmethod
    def spare(tokens: int, geometry) -> int:
        """Of `tokens` of KV memory, what slot sets may hold: the rest is the spare buffer a change needs."""
        buffers = 2 * geometry.layers
        return tokens - -(-tokens // (buffers + 1))

    def others(self, owner) -> int:
        return sum(n for key, n in self.held.items() if key != id(owner))

    def room(self, owner=None) -> int:
        """Tokens a slot set may hold beside what the others hold."""
        return self.usable - self.others(owner)

    def claim(self, owner, tokens: int, old: int, what: str) -> None:
        """owner's buffers, which hold `old` tokens, will hold `tokens`. Raises KVBudgetExceeded, naming what, where
        that does not fit beside the others, or where the change itself would not (old and new at once)."""
        others, larger = self.others(owner), max(tokens, old)
        if others + tokens > self.usable or others + larger + -(-larger // self.buffers) > self.tokens:
            raise KVBudgetExceeded(
                f"keys and values for {what} ({self.describe(tokens)}) do not fit beside the {others} tokens held, in "
                f"the engine's KV budget of {self.describe(self.usable)}"
            )
        self.held[id(owner)] = tokens

    def drop(self, owner_id: int) -> None:
        self.held.pop(owner_id, None)

    def describe(self, tokens: int) -> str:
        return f"{tokens} tokens, {tokens * self.bytes_per_token / 2**30:.2f} GiB"
