"""One decoding step over the running batch, transactional: until the picks are read nothing is changed (not the
slots, not a row), so an out-of-memory error raised anywhere in it leaves the batch as it was.

1. Feeding rows: every live row with tokens not yet computed (a prompt's remainder, or its last pick and the tokens
   its grammar forces after it), except rows waiting for a shared prefix that this step computes.
2. Drafts: each feeding row may add tokens guessed by n-gram lookup (drafts.py), checked in this same pass.
3. Read points: the judge's pick is read after each row's pending tokens and after each of its guessed tokens.
4. The pass: every feed as one flat ragged sequence through the decoder (forward.py).
5. Masks: while the device runs the pass, the grammar mask of every read point is filled on the CPU.
6. Picks: the greedy pick and P(yes) at every read point, in one transfer; only now is the pass committed.
7. Prefixes formed: a unit's prefix, computed in its lead's slot, goes to the prefix store and into the slots of
   the rows waiting for it.
8. Accept: each row keeps its draft up to the first token its own pick disagrees with, and that pick (exactly
   what decoding one token per step gives); guessed tokens it did not keep are given back.
9. Finished rows free their slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from offline_sumscore.core.errors import Failure
from offline_sumscore.engine.local.drafts import Draft, Drafter
from offline_sumscore.engine.local.features import EngineStats
from offline_sumscore.engine.local.forward import Passes
from offline_sumscore.engine.local.prefix_store import PrefixStore
from offline_sumscore.engine.local.sampling import Pick, ReadPoint, Sampler
from offline_sumscore.engine.local.scheduler import Batch, Row


@dataclass
class Feed:
    """What one row feeds in a step: its pending tokens, then its draft (if any), and its first mask row."""

    slot: int
    pending: list[int]
    draft: Draft | None
    mask_row: int

    @property
    def tokens(self) -> list[int]:
        return self.pending + (self.draft.tokens if self.draft else [])

    def read_points(self, first_token: int) -> list[ReadPoint]:
        """After its pending tokens, and after each guessed draft token (Draft.read_points)."""
        last = len(self.pending) - 1
        after = [0] + (self.draft.read_points() if self.draft else [])
        return [ReadPoint(self.slot, first_token + last + m, self.mask_row + m, m) for m in after]


class Stepper:
    def __init__(self, passes: Passes, sampler: Sampler, drafter: Drafter, store: PrefixStore, stats: EngineStats):
        self.passes, self.sampler, self.drafter, self.store, self.stats = passes, sampler, drafter, store, stats

    def step(self, batch: Batch) -> None:
        """One step (the module docstring's numbered steps)."""
        rows, cache = batch.rows, batch.cache
        feeding = self.feeding(batch)  # 1
        if not feeding:
            return
        drafts = self.drafter.propose(rows, feeding)  # 2
        feeds = self.feeds(rows, feeding, drafts)  # 3
        flat = [[] for _ in rows]
        for feed in feeds:
            flat[feed.slot] = feed.tokens
        starts = [r.computed if r is not None else 0 for r in rows]
        hidden, offsets = self.passes.run(cache, flat, starts, kind="step", commit=False)  # 4
        bitmask, only_eos = self.sampler.masks(rows, feeding, drafts, {f.slot: f.mask_row for f in feeds})  # 5
        reads = [read for feed in feeds for read in feed.read_points(int(offsets[feed.slot]))]
        try:  # 6
            logits = self.passes.logits(hidden, [r.hidden_at for r in reads], self.sampler.vocab_size)
            picks = self.sampler.pick(rows, reads, logits, bitmask)
        except BaseException:
            cache.abort()
            raise
        cache.commit()
        picked = {(read.slot, read.after_draft): pick for read, pick in zip(reads, picks)}
        for feed in feeds:
            row = rows[feed.slot]
            row.computed += len(feed.pending)
        self.formed(batch)  # 7
        returned = []  # (slot, how many of its last tokens): draft tokens the judge did not pick
        for feed in feeds:  # 8
            row = rows[feed.slot]
            if only_eos[feed.slot]:  # complete, though llguidance did not say so when its last token went in
                row.done = True
                continue
            kept = self.accept(row, feed.draft, picked, feed.slot)
            if feed.draft:
                self.stats.draft_tokens += len(feed.draft.tokens)
                self.stats.accepted_draft_tokens += kept
                if kept < len(feed.draft.tokens):
                    returned.append((feed.slot, len(feed.draft.tokens) - kept))
        cache.give_back(returned)
        batch.release_finished()  # 9: their slots are free for the next admission; nothing is copied

    @staticmethod
    def feeding(batch: Batch) -> list[int]:
        """A row whose grammar is complete finished when its last token was taken, without a pass. Every other
        live row has pending tokens, unless it waits for a shared prefix."""
        waiting = batch.waiting()
        return [
            s
            for s, r in enumerate(batch.rows)
            if r is not None and not r.done and r.ticket not in waiting and r.computed < len(r.prompt_ids) + len(r.out)
        ]

    @staticmethod
    def feeds(rows: list[Row | None], feeding: list[int], drafts: dict[int, Draft]) -> list[Feed]:
        """Each feeding row's feed, its mask rows numbered in feeding order (one, plus one per draft token)."""
        feeds, mask_row = [], 0
        for s in feeding:
            draft = drafts.get(s)
            feeds.append(Feed(s, rows[s].pending, draft, mask_row))
            mask_row += 1 + (len(draft.tokens) if draft else 0)
        return feeds

    def formed(self, batch: Batch) -> None:
        """Units whose lead has computed their prefix: it goes to the prefix store, and into the waiting rows'
        slots; those rows feed their own remainders (and any forced tokens already taken) from the next step."""
        still = []
        for forming in batch.forming:
            lead, shared = forming.lead, len(forming.prefix)
            if lead.computed < shared:
                still.append(forming)
                continue
            self.store.keep(forming.prefix, batch.cache, lead.slot)
            batch.cache.fork(lead.slot, [r.slot for r in forming.waiting], shared)
            for row in forming.waiting:
                row.computed = shared
        batch.forming = still

    def accept(self, row: Row, draft: Draft | None, picked: dict[tuple[int, int], Pick], slot: int) -> int:
        """Take the row's picks in order, as decoding token by token would have taken them: each guessed token
        stays while the pick before it equals it (a forced one stays as the grammar fixed it), and the first pick
        that differs, or the one after the last guessed token, is the row's next pending token. Returns how many
        draft tokens stayed (their keys and values are in the cache; the step gives the rest back, and the row's
        next pass writes over them)."""
        tokens = draft.tokens if draft else []
        m = 0
        while True:
            if m < len(tokens) and draft.forced[m]:
                row.matcher.consume_token(tokens[m])
                self._kept(row, tokens[m])
                row.forced += 1
                self.stats.forced_tokens += 1
                m += 1
                continue
            if m:  # a read point after a kept guess: as a step would check before reading
                if fail_at_cap(row):
                    return m
                self.sampler.finish_if_complete(row)
                if row.done:
                    return m
            pick = picked[(slot, m)]
            if pick.token < 0:
                self.stats.nan_rows += 1
                row.fail(
                    Failure.MODEL,
                    "the judge's logits were NaN at this step (a poisoned forward pass); nothing was read from them",
                )
                return m
            if pick.p_yes is not None:
                row.choice_probs.append(pick.p_yes)
            row.decoded += 1
            self.stats.decoded_tokens += 1
            if pick.token in self.sampler.eos_ids:
                row.out.append(pick.token)
                row.done = True
                return m
            row.matcher.consume_token(pick.token)
            if m < len(tokens) and pick.token == tokens[m]:
                self._kept(row, pick.token)
                m += 1
                continue
            row.out.append(pick.token)
            if self.sampler.features.forced_tokens:
                self.sampler.take_forced(row)
            fail_at_cap(row)
            self.sampler.finish_if_complete(row)
            return m

    @staticmethod
    def _kept(row: Row, token: int) -> None:
        """A draft token the row keeps: in its output, and computed (the pass wrote its keys and values)."""
        row.out.append(token)
        row.computed += 1


def fail_at_cap(row: Row) -> bool:
    """A row whose output reached its token cap fails, its raw output kept; returns whether it did."""
    if len(row.out) < row.cap:
        return False
    row.fail(Failure.CAP, f"hit the {row.cap}-token cap before the JSON closed; raw output kept")
    return True
