"""Requests into rows, and rows into the running batch.

Rows are admitted as units (scheduler.py): requests that share a long token prefix, whichever sample they come from,
form one unit whose prefix is computed once, in one row, and copied into the others' slots. A prefix found in the
prefix store is copied from there instead. Admission only places rows and copies stored prefixes: every token is
computed in the decoding steps, beside the running rows (chunked prefill: no pass of its own).
"""

from __future__ import annotations

import time

from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local.features import EngineStats
from offline_sumscore.engine.local.memory import MemoryGuard, fail_alone, halves
from offline_sumscore.engine.local.prefix_store import PrefixStore
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.sampling import Sampler
from offline_sumscore.engine.local.scheduler import Batch, Forming, Scheduler, Unit


def rows_for(judge, ready: list[tuple[int, StageRequest]]) -> list[Row]:
    """One row per request, its prompt rendered and tokenized once; a request that cannot run fails here, loudly."""
    tok = judge.tokenizer
    prompts = [judge.render(r.messages) for _, r in ready]
    ids = tok(prompts, add_special_tokens=False)["input_ids"]  # the chat template wrote any special tokens
    rows = []
    for (ticket, request), prompt, prompt_ids in zip(ready, prompts, ids):
        if request.continuation is not None:
            # The continuation is tokenized on its own, as the reply it stands for would be generated.
            continuation = tok(request.continuation, add_special_tokens=False)["input_ids"]
            row = Row(ticket, request, prompt, prompt_ids + continuation, 0, len(ready), score_from=len(prompt_ids))
            problem = judge.likelihood_problem(len(prompt_ids), len(continuation))
        else:
            cap, problem = judge.output_cap(request, len(prompt_ids))
            row = Row(ticket, request, prompt, prompt_ids, cap, len(ready))
        if problem:
            row.fail(*problem)
        rows.append(row)
    return rows


class Admission:
    def __init__(self, sampler: Sampler, store: PrefixStore, memory: MemoryGuard, stats: EngineStats):
        self.sampler, self.store, self.memory, self.stats = sampler, store, memory, stats
        self.below: int | None = None  # after an admission ran out of memory: wait until fewer rows run

    def wait_below(self, rows: int) -> None:
        """Admit nothing until fewer than `rows` rows run: after running out of memory, the rows sent back wait for
        a running row to leave, instead of coming straight back to the allocation that failed."""
        self.below = rows

    def admit(self, scheduler: Scheduler, batch: Batch) -> None:
        """Place the units the scheduler picks in the running batch. Out of memory there: retry with half the
        units; a single unit waits until fewer rows run (not retried every step), and fails loudly only when it
        cannot run even alone. A unit that the scheduler finds too large even alone fails at once, naming what it
        needs. (Out of memory in the step that computes their prompts is the step's.)"""
        if self.below is not None and len(batch.live) >= self.below:
            return
        chosen = []
        for unit in scheduler.schedule(batch):
            why = scheduler.too_large(unit)
            if why is None:
                chosen.append(unit)
            else:
                fail_alone(unit.rows, f"too large to run even alone: {why}")
        while chosen:
            if self.memory.attempt(self.place, chosen, batch):
                self.below = None
                return
            if len(chosen) > 1:
                chosen, rest = halves(chosen)
                scheduler.put_back(rest)
            elif len(chosen[0].rows) > 1:  # one unit: its rows in two halves, each computing the prefix
                unit = chosen[0]
                first, second = halves(unit.rows)
                scheduler.put_back([Unit(second, unit.prefix)])
                chosen = [Unit(first, unit.prefix)]
            elif batch.live:
                scheduler.put_back(chosen)
                self.below = len(batch.live)
                return
            else:
                fail_alone(chosen[0].rows, self.memory.alone())
                return

    def place(self, units: list[Unit], batch: Batch) -> None:
        """Each unit's rows into free slots of the running batch, with the longest stored part of its prefix
        copied from the prefix store into its first row (the lead). A unit of several rows computes the rest of
        its prefix once, in its lead, which feeds its whole remainder in the next step; after that step the prefix
        is copied into the other rows' slots (step.Stepper.formed). Raises with the batch as it was."""
        rows = [row for unit in units for row in unit.rows]
        batch.place(rows)
        try:
            found = self.store.longest([u.prefix for u in units])
            for unit, (kv, n) in zip(units, found):
                if n:
                    batch.cache.write(unit.rows[0].slot, kv, n)
                    self.stats.stored_tokens += n
                if len(unit.rows) > 1 and n == len(unit.prefix):  # found whole: nothing to compute first
                    batch.cache.fork(unit.rows[0].slot, [r.slot for r in unit.rows[1:]], n)
        except BaseException:
            batch.release(rows)
            raise
        now = time.perf_counter()
        for unit, (_, n) in zip(units, found):
            self._start(unit, n, batch, now)

    def _start(self, unit: Unit, n: int, batch: Batch, now: float) -> None:
        """The unit's rows start: each with what is computed in its slot, its grammar state, and its forced tokens.
        A lead that ends at once (its grammar took nothing) computes nothing: each row then computes the prefix
        itself."""
        lead, others = unit.rows[0], unit.rows[1:]
        whole = n == len(unit.prefix)
        for row in unit.rows:
            # n tokens are copied into its slot (the lead's) or into all (a whole prefix); the rest is fed
            self.stats.prefill_tokens += len(row.prompt_ids) - (n if row is lead or not others else len(unit.prefix))
            self.sampler.start(row, n, now)
        if whole:
            return
        if not lead.done:
            batch.forming.append(Forming(lead, others, unit.prefix))
            return
        for row in others:
            if n:
                batch.cache.fork(lead.slot, [row.slot], n)
            self.stats.prefill_tokens += len(unit.prefix) - n
