"""Likelihood requests (StageRequest.continuation): nothing is generated, so they skip the decoding loop. The prefix
a group of them shares is computed once and copied to the group's rows, every row's remainder (the end of its
prompt and its continuation) runs in one ragged pass, and the log-probability of each continuation token is read
at the position before it."""

from __future__ import annotations

import time

import torch

from offline_sumscore.core.errors import Failure
from offline_sumscore.engine.local.features import EngineFeatures, EngineStats
from offline_sumscore.engine.local.forward import Passes
from offline_sumscore.engine.local.kv_slots import KVSlots
from offline_sumscore.engine.local.memory import MemoryGuard, fail_alone, halves
from offline_sumscore.engine.local.prefix_store import PrefixStore
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.scheduler import common_prefix, split_by_prefix
from offline_sumscore.engine.local.transfer import to_device

READ_AT_ONCE = 256  # continuation tokens projected onto the vocabulary together


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
        vocab_size: int,
    ):
        self.passes, self.store, self.memory, self.stats, self.features = passes, store, memory, stats, features
        self.max_rows, self.token_budget, self.vocab_size = max_rows, token_budget, vocab_size
        self._kept: KVSlots | None = None

    def _slots(self, rows: int) -> KVSlots:
        """KV slots for one group's pass. On a CPU one set serves every group, emptied between them, taken from the
        judge's idle ones for each score() (Passes.take_slots): a fresh set per group (tens of MB a layer, each
        group's of another size) left the heap more fragmented with every group, and the resident memory of a long
        run crept up while the memory in use stayed flat. On a GPU a fresh set per group, which PyTorch's caching
        allocator recycles, so that the decoding batch can use that memory between groups."""
        if self.passes.device.type != "cpu":
            return self.passes.slots(rows)
        if self._kept is None:
            self._kept = self.passes.take_slots()
        self._kept.empty()  # a pass that raised left it open
        return self._kept

    def score(self, rows: list[Row]) -> None:
        """Every likelihood row, group by group (rows that share a prompt prefix, whichever sample they belong to),
        in batches within the row cap and the token budget."""
        try:
            for group in split_by_prefix(rows) if self.features.shared_prefix else [[r] for r in rows]:
                prefix = common_prefix([r.prompt_ids for r in group], min(r.feed_from for r in group))
                size = min(self.max_rows, max(1, self.token_budget // max(len(r.prompt_ids) for r in group)))
                for at in range(0, len(group), size):
                    self.batch(group[at : at + size], prefix)
        finally:
            if self._kept is not None:  # back to the judge for the next call (Passes.take_slots)
                self.passes.give_slots(self._kept)
                self._kept = None

    def batch(self, rows: list[Row], prefix: list[int]) -> None:
        """One pass; out of memory: two halves, down to a row that cannot run alone, which fails loudly."""
        if self.memory.attempt(self.one_pass, rows, prefix):
            return
        if len(rows) == 1:
            fail_alone(rows)
            return
        for half in halves(rows):
            self.batch(half, prefix)

    def one_pass(self, rows: list[Row], prefix: list[int]) -> None:
        """The group's prefix once, in the first row's slot (its stored part copied from the prefix store), copied
        into the other rows' slots; then every row's remainder, its continuation included, in one ragged pass."""
        now = time.perf_counter()
        slots = self._slots(len(rows))
        slots.place(len(rows))
        (kv, kept), start = self.store.longest([prefix])[0], len(prefix)
        if kept:
            slots.write(0, kv, kept)
            self.stats.stored_tokens += kept
        if start > kept:
            feeds = [prefix[kept:]] + [[]] * (len(rows) - 1)
            self.passes.run(slots, feeds, [kept] + [0] * (len(rows) - 1), kind="likelihood")
            self.stats.prefill_tokens += start - kept
            self.store.keep(prefix, slots, 0)
        slots.fork(0, list(range(1, len(rows))), start)
        rests = [r.prompt_ids[start:] for r in rows]
        hidden, offsets = self.passes.run(slots, rests, [start] * len(rows), kind="likelihood")
        self.stats.prefill_tokens += sum(len(rest) for rest in rests)
        for row in rows:
            row.start_scoring(start, now)
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
