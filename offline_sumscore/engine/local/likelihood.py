"""Likelihood requests (StageRequest.continuation): nothing is generated, so they skip the decoding loop. The prefix
a group of them shares is computed once and copied to the group's rows, every row's remainder (the end of its
prompt and its continuation) runs in one ragged pass, and the log-probability of each continuation token is read
at the position before it. Groups are packed: one pass computes the prefixes of several groups, and the next their
rows' remainders, within the row cap, the token budget and a pass's tokens. A stage's likelihood rows come in
groups of one source and a few claims, or of one claim and its baseline: a pass each would be tens of tokens, and a
pass's fixed cost (every layer's weights read once, its calls) would dominate.

    groups:  [source A: 3 claims] [source B: 2 claims] [baseline 1] [baseline 2] ...
    pass 0:  the chat preamble they all open with, once, into the prefix store (where it is not there yet)
    pass 1:  A's prefix | B's prefix | baseline 1's | baseline 2's     (each in its group's first slot, from the
             stored preamble on)
    fork:    A's prefix into A's other slots, B's into B's
    pass 2:  every row's remainder and continuation, log-probabilities read"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from offline_sumscore.core.errors import Failure
from offline_sumscore.engine.local.features import EngineFeatures, EngineStats
from offline_sumscore.engine.local.forward import Passes
from offline_sumscore.engine.local.kv_slots import KVSlots, padded_columns
from offline_sumscore.engine.local.memory import MemoryGuard, fail_alone, halves
from offline_sumscore.engine.local.prefix_store import STORE_BLOCK, PrefixStore
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.scheduler import common_prefix, split_by_prefix
from offline_sumscore.engine.local.transfer import to_device

READ_AT_ONCE = 256  # continuation tokens projected onto the vocabulary together


def padding_allowed(tokens: int, pass_tokens: int) -> int:
    """The slot cells (rows x the widest row) a pack of `tokens` prompt tokens may hold: twice its tokens, or one
    pass's worth. Slots are as wide as their widest row, so short rows packed beside a long source would each hold
    its width of keys and values."""
    return max(2 * tokens, pass_tokens)


def spread_too_far(slots: KVSlots, rows: int, columns: int) -> bool:
    """Whether a kept CPU slot set, spanned for a pack of rows x columns, would span more than twice the cells a set
    of the pack's own shape would: the cells earlier packs wrote stay resident in it."""
    own = rows * padded_columns(columns)
    return max(slots.finite, rows) * max(slots.clean, padded_columns(columns)) > max(
        2 * own, slots.finite * slots.clean
    )


@dataclass(frozen=True)
class PrefixGroup:
    """Rows whose prompts open with the same prefix, computed once in the first row's slot."""

    rows: list[Row]
    prefix: list[int]


class LikelihoodPath:
    def __init__(
        self,
        passes: Passes,
        store: PrefixStore,
        memory: MemoryGuard,
        stats: EngineStats,
        *,
        features: EngineFeatures,
        max_rows: int,
        token_budget: int,
        pass_tokens: int,
        vocab_size: int,
    ):
        self.passes, self.store, self.memory, self.stats, self.features = passes, store, memory, stats, features
        self.max_rows, self.token_budget, self.pass_tokens = max_rows, token_budget, pass_tokens
        self.vocab_size = vocab_size
        self._kept: KVSlots | None = None
        self.bounded = passes.memory.bounded
        self.deferred: list[Row] = []  # rows that did not fit beside the running batch: scored once it shrinks
        self._room_later = False

    def _slots(self, rows: int, columns: int) -> KVSlots:
        """KV slots for one pack's passes. On a CPU one set serves every pack, emptied between them, taken from the
        judge's idle ones for each score() (Passes.take_slots): a fresh set per group (tens of MB a layer, each
        group's of another size) left the heap more fragmented with every group, and the resident memory of a long
        run crept up while the memory in use stayed flat. On a bounded device (a GPU) a fresh set per pack of
        exactly its shape, claimed from the KV budget beside the running batch's slots and freed after the pack."""
        if self.bounded:
            return self.passes.slots(rows, columns)
        if self._kept is None:
            self._kept = self.passes.take_slots()
        elif spread_too_far(self._kept, rows, columns):
            # The kept set keeps resident every cell any pack wrote (zeroed, before zero pages: every slot it ever
            # held times every column it ever held; a 2,500-word source beside eleven short rows took the embedded
            # judge to 11.9 GB). A fresh set of this pack's shape gives the old cells back to the system instead.
            self._kept = self.passes.fresh_slots(self._kept)
        self._kept.empty()  # a pass that raised left it open
        return self._kept

    def score(self, rows: list[Row], room_later: bool = False) -> None:
        """Every likelihood row: grouped by shared prefix (rows that share a prompt prefix, whichever sample they
        belong to), the groups packed into batches (packs). room_later: the running batch holds memory it will give
        back, so on a bounded device a row that does not fit beside it now waits (deferred) instead of failing."""
        self._room_later = room_later and self.bounded
        try:
            for pack in self.packs(rows):
                self.batch(pack)
        finally:
            if self._kept is not None:  # back to the judge for the next call (Passes.take_slots)
                self.passes.give_slots(self._kept)
                self._kept = None

    def take_deferred(self) -> list[Row]:
        rows, self.deferred = self.deferred, []
        return rows

    def packs(self, rows: list[Row]) -> list[list[PrefixGroup]]:
        """The groups, each cut to what one batch holds (the row cap; the token budget over its longest prompt,
        slots being as wide as their widest row), packed in order while a pack fits (fits). Depends on the prompts
        only."""
        parts = []
        for group in split_by_prefix(rows) if self.features.shared_prefix else [[r] for r in rows]:
            prefix = common_prefix([r.prompt_ids for r in group], min(r.feed_from for r in group))
            size = min(self.max_rows, max(1, self.token_budget // max(len(r.prompt_ids) for r in group)))
            parts += [PrefixGroup(group[at : at + size], prefix) for at in range(0, len(group), size)]
        # Narrow groups before wide ones: packs then change width once or twice, not at every long source.
        parts.sort(key=lambda part: max(len(r.prompt_ids) for r in part.rows))
        packs: list[list[PrefixGroup]] = []
        for part in parts:
            if packs and self.fits(packs[-1] + [part]):
                packs[-1].append(part)
            else:
                packs.append([part])
        return packs

    def fits(self, pack: list[PrefixGroup]) -> bool:
        """Within the row cap, the token budget (rows x the widest prompt; on a bounded device, in the slots' own
        shape, beside what the running batch holds now) and, for each of its two passes, the tokens a pass carries
        (prefixes counted whole, before the prefix store serves any)."""
        rows = [r for g in pack for r in g.rows]
        prefixes = sum(len(g.prefix) for g in pack)
        rests = sum(len(r.prompt_ids) - len(g.prefix) for g in pack for r in g.rows)
        budget, width = self.token_budget, max(len(r.prompt_ids) for r in rows)
        if self.bounded:
            budget, width = min(budget, self.passes.budget.room()), padded_columns(width)
        return (
            len(rows) <= self.max_rows
            and len(rows) * width <= budget
            and max(prefixes, rests) <= self.pass_tokens
            and len(rows) * width <= padding_allowed(sum(len(r.prompt_ids) for r in rows), self.pass_tokens)
        )

    def opening(self, pack: list[PrefixGroup]) -> list[int]:
        """The start that every group's prefix in the pack shares (a chat preamble, a source under two groups), in
        whole blocks of the prefix store, where the store lacks it: computed once, in a pass of its own before the
        prefixes, and stored, so that every group's prefix starts from it instead of computing it again beside the
        others. None ([]) for a lone group or where the store is off."""
        if len(pack) < 2 or not self.store.budget:
            return []
        shared = common_prefix([g.prefix for g in pack], min(len(g.prefix) for g in pack))
        shared = shared[: len(shared) // STORE_BLOCK * STORE_BLOCK]
        if not shared or self.store.longest([shared])[0][1] >= len(shared):
            return []
        return shared

    def batch(self, pack: list[PrefixGroup]) -> None:
        """One pack; out of memory: two halves (of its groups, or of a lone group's rows), down to a row that cannot
        run alone, which fails loudly."""
        if self.memory.attempt(self.one_pack, pack):
            return
        if len(pack) > 1:
            halved = halves(pack)
        elif len(pack[0].rows) > 1:
            halved = [[PrefixGroup(rows, pack[0].prefix)] for rows in halves(pack[0].rows)]
        elif self._room_later:  # the running batch's slots will shrink: this row waits for them
            self.deferred.extend(pack[0].rows)
            return
        else:
            fail_alone(pack[0].rows, self.memory.alone())
            return
        for half in halved:
            self.batch(half)

    def one_pack(self, pack: list[PrefixGroup]) -> None:
        """Each group's prefix once, in its first row's slot (its stored part copied from the prefix store), all in
        one pass, then copied into the group's other slots; then every row's remainder, its continuation included,
        in one ragged pass."""
        now = time.perf_counter()
        rows = [r for g in pack for r in g.rows]
        slots = self._slots(len(rows), max(len(r.prompt_ids) for r in rows))
        try:
            self._run_pack(pack, rows, slots, now)
        finally:
            if self.bounded:  # its claim on the KV budget goes with it
                slots.free()

    def _run_pack(self, pack: list[PrefixGroup], rows: list[Row], slots: KVSlots, now: float) -> None:
        slots.place(len(rows))
        leads = [sum(len(g.rows) for g in pack[:i]) for i in range(len(pack))]  # each group's first slot
        opening = self.opening(pack)
        if opening:
            self.passes.run(slots, [opening] + [[]] * (len(rows) - 1), [0] * len(rows), kind="likelihood")
            self.stats.prefill_tokens += len(opening)
            self.store.keep(opening, slots, 0)
        feeds, starts = [[] for _ in rows], [0] * len(rows)
        for group, lead in zip(pack, leads):
            (kv, kept), held = self.store.longest([group.prefix])[0], slots.filled[lead]  # held: the opening
            if kept > held:
                slots.write(lead, kv, kept)
                self.stats.stored_tokens += kept - held
            kept = max(kept, held)
            feeds[lead], starts[lead] = group.prefix[kept:], kept
        if any(feeds):
            self.passes.run(slots, feeds, starts, kind="likelihood")
            self.stats.prefill_tokens += sum(map(len, feeds))
            for group, lead in zip(pack, leads):
                if feeds[lead]:
                    self.store.keep(group.prefix, slots, lead)
        for group, lead in zip(pack, leads):
            slots.fork(lead, list(range(lead + 1, lead + len(group.rows))), len(group.prefix))
        rests = [r.prompt_ids[len(g.prefix) :] for g in pack for r in g.rows]
        hidden, offsets = self.passes.run(
            slots, rests, [len(g.prefix) for g in pack for _ in g.rows], kind="likelihood"
        )
        self.stats.prefill_tokens += sum(len(rest) for rest in rests)
        for group in pack:
            for row in group.rows:
                row.start_scoring(len(group.prefix), now)
        self.read(rows, [len(rest) for rest in rests], hidden, offsets)
        for row in rows:
            row.finish()

    def read(self, rows: list[Row], fed: list[int], hidden, offsets) -> None:
        """The log-probability of every continuation token fed in this pass, read at the position before it, and the
        token the judge expected most there with its log-probability (the evidence behind a verdict). The vocabulary
        projection runs only at those positions, READ_AT_ONCE at a time, and comes back in one transfer each."""
        wanted = []  # (row, its token's place in this pass's hidden states, the token it predicts)
        for row, n, first in zip(rows, fed, offsets):
            for j in range(n):
                target = row.computed + j + 1  # index in prompt_ids of the token the logits at j predict
                if row.score_from <= target < len(row.prompt_ids):
                    wanted.append((row, int(first) + j, row.prompt_ids[target]))
        for at in range(0, len(wanted), READ_AT_ONCE):
            part = wanted[at : at + READ_AT_ONCE]
            logits = self.passes.logits(hidden, [w[1] for w in part], self.vocab_size)
            targets = to_device(torch.tensor([w[2] for w in part], dtype=torch.long), logits.device)
            norm = torch.logsumexp(logits, dim=-1)
            top, top_id = logits.max(dim=-1)
            back = torch.stack([logits.gather(1, targets[:, None])[:, 0] - norm, top_id.float(), top - norm], 1)
            for (row, _, _), (value, expected, expected_logp) in zip(part, back.tolist()):
                row.read_logprob(value, int(expected), expected_logp)
        for row in rows:
            if any(v != v for v in row.logprobs) and not row.done:
                self.stats.nan_rows += 1
                row.fail(Failure.MODEL, "the judge's log-probabilities were NaN (a poisoned forward pass)")
