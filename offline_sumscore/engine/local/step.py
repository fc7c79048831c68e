"""One decoding step over the running batch, transactional: until the picks are read nothing is changed (not the
slots, not a row), so an out-of-memory error raised anywhere in it leaves the batch as it was.

1. Plan (plan.plan_step): every live row with tokens not yet computed feeds them (a prompt's remainder, or its
   last pick and the tokens its grammar forces after it), except rows waiting for a shared prefix that this step
   computes, within the pass's token budget (a long prompt goes in chunks over several steps); each row fed whole
   may add a draft of guessed tokens (drafts.py), checked in this same pass. The judge's pick is read after each
   whole row's pending tokens and after each of its guessed tokens.
2. The pass: every feed as one flat ragged sequence through the decoder (forward.py), and the vocabulary
   projection at the read points after it, both launched before the host does anything else.
3. Masks: while the device runs the pass and the projection, the grammar mask of every read point is filled on
   the CPU (on a CPU, whose pass is synchronous, after them: filled in a thread beside the pass they gained nothing
   measurable on the 2-core machine, docs/performance.md).
4. Picks: the greedy pick and P(yes) at every read point, in one transfer; only now is the pass committed.
5. Update (Stepper.update, the one place a step changes rows): pending tokens computed; a unit's prefix, computed
   in its lead's slot, goes to the prefix store and into the slots of the rows waiting for it; each row keeps its
   draft up to the first token its own pick disagrees with, and that pick (exactly what decoding one token per
   step gives); guessed tokens it did not keep are given back; finished rows free their slots. Nothing in it
   allocates on a bounded device (the store's pool is allocated when the engine is sized), and whatever fails in
   it fails the one row it touched, never the step: a step that raised after its commit used to leave its rows
   computed but with nothing pending, and a stream that never ended.
"""

from __future__ import annotations

from offline_sumscore.core.errors import Failure
from offline_sumscore.engine.local.device_memory import is_out_of_memory
from offline_sumscore.engine.local.drafts import Draft, Drafter
from offline_sumscore.engine.local.features import EngineStats
from offline_sumscore.engine.local.forward import Passes
from offline_sumscore.engine.local.plan import Feed, Pick, StepOutput, StepPlan, plan_step
from offline_sumscore.engine.local.prefix_store import PrefixStore
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.sampling import Sampler
from offline_sumscore.engine.local.scheduler import Batch
from offline_sumscore.engine.retry import engine_raised


class Stepper:
    def __init__(
        self,
        passes: Passes,
        sampler: Sampler,
        drafter: Drafter,
        store: PrefixStore,
        stats: EngineStats,
        *,
        pass_tokens: int,
    ):
        self.passes, self.sampler, self.drafter, self.store, self.stats = passes, sampler, drafter, store, stats
        self.pass_tokens = pass_tokens  # tokens a pass computes at most (plan.fed_per_row)

    def step(self, batch: Batch) -> None:
        """One step (the module docstring's numbered steps)."""
        plan = plan_step(batch, self.drafter, self.pass_tokens)  # 1
        if plan is None:
            return
        cache = batch.cache
        hidden, offsets = self.passes.run(cache, plan.tokens, plan.starts, kind="step", commit=False)  # 2
        try:  # a failure from here on leaves the cache as it was, as a failed pass does
            reads = plan.read_points(offsets)
            logits = self.passes.logits(hidden, [r.hidden_at for r in reads], self.sampler.vocab_size)
            bitmask, only_eos = self.sampler.masks(batch.rows, plan)  # 3
            picks = self.sampler.pick(batch.rows, reads, logits, bitmask)  # 4
        except BaseException:
            cache.abort()
            raise
        cache.commit()
        picked = {(read.slot, read.after_draft): pick for read, pick in zip(reads, picks)}
        self.update(batch, plan, StepOutput(picked, only_eos))  # 5

    def update(self, batch: Batch, plan: StepPlan, output: StepOutput) -> None:
        """Every change a step makes to its rows and the batch, from its plan and what the model said."""
        rows = batch.rows
        for feed in plan.feeds:
            row = rows[feed.slot]
            row.computed_to(row.computed + len(feed.pending))
        self.formed(batch)
        returned = []  # (slot, how many of its last tokens): draft tokens the judge did not pick
        for feed in plan.reading:  # a chunk of a prompt has nothing read after it
            row = rows[feed.slot]
            if output.only_eos[feed.slot]:  # complete, though llguidance did not say so when its last token went in
                row.finish()
                continue
            try:
                kept = self.accept(row, feed, output.picks)
            except Exception as exc:  # noqa: BLE001 - this row fails, naming the error; the others go on
                row.fail(Failure.MEMORY if is_out_of_memory(exc) else Failure.MODEL, engine_raised(exc))
                continue
            if feed.draft:
                self.stats.draft_tokens += len(feed.draft.tokens)
                self.stats.accepted_draft_tokens += kept
                if kept < len(feed.draft.tokens):
                    returned.append((feed.slot, len(feed.draft.tokens) - kept))
        batch.cache.give_back(returned)
        batch.release_finished()  # their slots are free for the next admission; nothing is copied

    def formed(self, batch: Batch) -> None:
        """Units whose lead has computed their prefix: it goes to the prefix store, and into the waiting rows'
        slots; those rows feed their own remainders (and any forced tokens already taken) from the next step. Where
        the copy runs out of memory, the waiting rows compute the prefix themselves, from what their slots hold."""
        still = []
        for forming in batch.forming:
            lead, shared = forming.lead, len(forming.prefix)
            if lead.computed < shared:
                still.append(forming)
                continue
            self.store.keep(forming.prefix, batch.cache, lead.slot)  # stores nothing where memory runs out
            try:
                batch.cache.fork(lead.slot, [r.slot for r in forming.waiting], shared)
            except Exception as exc:  # noqa: BLE001 - only running out of memory is recovered here
                if not is_out_of_memory(exc):
                    raise
                continue  # a copy cut short wrote only past what each row holds, which its own pass writes over
            for row in forming.waiting:
                row.computed_to(shared)
        batch.forming = still

    def accept(self, row: Row, feed: Feed, picked: dict[tuple[int, int], Pick]) -> int:
        """Take the row's picks in order, as decoding token by token would have taken them: each guessed token
        stays while the pick before it equals it (a forced one stays as the grammar fixed it), and the first pick
        that differs, or the one after the last guessed token, is the row's next pending token. Returns how many
        draft tokens stayed (their keys and values are in the cache; the step gives the rest back, and the row's
        next pass writes over them)."""
        draft: Draft | None = feed.draft
        tokens = draft.tokens if draft else []
        m = 0
        while True:
            if m < len(tokens) and draft.forced[m]:
                row.keep_forced_guess(tokens[m])
                self.stats.forced_tokens += 1
                m += 1
                continue
            if m:  # a read point after a kept guess: as a step would check before reading
                if row.fail_at_cap():
                    return m
                self.sampler.finish_if_complete(row)
                if row.done:
                    return m
                if (feed.slot, m) not in picked:
                    # The draft ended where its grammar stopped, so no pick was read after it (Draft.read_points): the
                    # end token is all decoding could take there, with or without logit verdicts' early finish.
                    row.stop_if_complete()
                    return m
            pick = picked[(feed.slot, m)]
            if pick.token < 0:
                self.stats.nan_rows += 1
                row.fail(
                    Failure.MODEL,
                    "the judge's logits were NaN at this step (a poisoned forward pass); nothing was read from them",
                )
                return m
            guessed = m < len(tokens) and pick.token == tokens[m]  # a draft never holds an end token (Drafter.fit)
            row.take_pick(pick.token, pick.p_yes, self.sampler.eos_ids, guessed=guessed)
            self.stats.decoded_tokens += 1
            if row.done:
                return m
            if guessed:
                m += 1
                continue
            if self.sampler.features.forced_tokens:
                self.sampler.take_forced(row)
            row.fail_at_cap()
            self.sampler.finish_if_complete(row)
            return m
