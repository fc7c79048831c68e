"""What the engine runs next, decided without touching the model: rows and their progress, units, the running
batch, admission under the row cap and the token budget, and preemption.

The engine carries out what this module decides (forward passes, grammar masks, reading verdicts). Every decision
here depends on the requests and the settings alone, never on timing, so a rerun forms the same batches and gives
the same rows. A row and its progress: rows.py; what one step runs: plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.engine.local.kv_slots import padded_columns
from offline_sumscore.engine.local.memory import halves
from offline_sumscore.engine.local.prefix_store import MIN_SHARED_PREFIX, common_length
from offline_sumscore.engine.local.rows import Row

OUTPUT_ALLOWANCE = 256  # output tokens a row is planned for, within its cap (most verdicts stop far sooner)


@dataclass
class Unit:
    rows: list[Row]
    prefix: list[int]  # computed once, then copied into every row's slot

    @classmethod
    def alone(cls, row: Row) -> Unit:
        """A row with no prefix to share: everything before the tokens it must feed is its prefix."""
        return cls([row], row.prompt_ids[: row.feed_from])

    @property
    def cost(self) -> int:  # tokens this unit will hold in the cache, padding aside
        return len(self.prefix) + sum(
            len(r.prompt_ids) - len(self.prefix) + min(r.cap, OUTPUT_ALLOWANCE) for r in self.rows
        )

    @property
    def width(self) -> int:
        """Columns its widest row will take in a slot: its prompt and the output it is planned for."""
        return max(planned_width(r) for r in self.rows)


def planned_width(row: Row) -> int:
    """A row's columns in its slot by the time it ends, as planned: its prompt and OUTPUT_ALLOWANCE of output (or what
    it has written, if more)."""
    return len(row.prompt_ids) + max(len(row.out), min(row.cap, OUTPUT_ALLOWANCE))


@dataclass
class Forming:
    """A unit placed with its prefix not yet (wholly) computed: its lead's next pass computes it; then it goes to
    the prefix store and into the waiting rows' slots, which feed their own remainders from the step after."""

    lead: Row
    waiting: list[Row]
    prefix: list[int]


@dataclass
class Batch:
    """The running batch: its rows by KV slot (None: a free slot), the slots (kv_slots.py), and the units whose
    prefix is being computed. A finished row frees its slot, which the next admitted row takes; no row ever moves."""

    cache: Any = None  # KVSlots
    rows: list[Row | None] = field(default_factory=list)
    admitted: int = 0  # rows admitted so far: each row's order of admission, for preemption
    forming: list[Forming] = field(default_factory=list)
    released: int = 0  # rows that have left so far (finished, failed or sent back)

    @property
    def live(self) -> list[Row]:
        return [r for r in self.rows if r is not None and not r.done]

    @property
    def width(self) -> int:
        return self.cache.width if self.cache is not None else 0

    def waiting(self) -> set[int]:
        """The tickets of rows waiting for a shared prefix: they feed nothing yet."""
        return {r.ticket for f in self.forming for r in f.waiting}

    def place(self, rows: list[Row]) -> None:
        """Slots for new rows (the lowest free first)."""
        slots = self.cache.place(len(rows))
        self.rows += [None] * (self.cache.rows - len(self.rows))
        for row, slot in zip(rows, slots):
            row.place(slot, self.admitted)
            self.admitted += 1
            self.rows[slot] = row

    def release(self, rows: list[Row]) -> None:
        """Free the slots of these rows (finished, or sent back to wait); a forming unit forgets them."""
        self.cache.release([r.slot for r in rows])
        self.released += len(rows)
        for r in rows:
            self.rows[r.slot] = None
            r.leave()
        del self.rows[self.cache.rows :]
        gone = {r.ticket for r in rows}
        self.forming = [
            Forming(f.lead, [r for r in f.waiting if r.ticket not in gone], f.prefix)
            for f in self.forming
            if f.lead.ticket not in gone
        ]

    def release_finished(self) -> None:
        done = [r for r in self.rows if r is not None and r.done]
        if done:
            self.release(done)


class Scheduler:
    """Waiting units in arrival order (within one arrival, longest first, so an out-of-memory error comes early);
    schedule() picks those that join the running batch at the next step.

    On a CPU the token budget counts the tokens rows will hold (Unit.cost); on a device of bounded memory
    (slot_bound) it counts what the slots will take, every slot of the span as wide as the widest row (slots x
    columns, planned_width), the same shapes the slots claim from the KV budget (kv_slots.py), so that what is
    admitted fits."""

    def __init__(self, *, max_rows: int, token_budget: int, shared_prefix: bool, slot_bound: bool = False):
        self.max_rows, self.token_budget, self.shared_prefix = max_rows, token_budget, shared_prefix
        self.slot_bound = slot_bound
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
        taken = sum(r is not None for r in batch.rows)  # slots held (slot_bound: the span grows past them)
        width = max((planned_width(r) for r in batch.live), default=0)
        chosen: list[Unit] = []
        while self.waiting:
            unit = self.waiting[0]
            if self.slot_bound:
                slots, columns = max(len(batch.rows), taken + len(unit.rows)), max(width, unit.width)
                over = slots * padded_columns(columns) > self.token_budget
            else:
                over = used + unit.cost > self.token_budget
            if (over or rows + len(unit.rows) > self.max_rows) and (rows or chosen):
                break
            chosen.append(self.waiting.pop(0))
            used += unit.cost
            rows += len(unit.rows)
            taken, width = taken + len(unit.rows), max(width, unit.width)
        return chosen

    def too_large(self, unit: Unit) -> str | None:
        """Why a unit cannot run even alone on a bounded device (its prompt's keys and values alone exceed the KV
        budget), in words; None where it can, or on a CPU."""
        need = max(len(r.prompt_ids) for r in unit.rows) + 1
        if not self.slot_bound or need <= self.token_budget:
            return None
        return (
            f"its prompt needs {need} tokens of keys and values, more than the engine's KV budget of "
            f"{self.token_budget} tokens on this device; use a shorter text, or a device with more memory"
        )

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
        _, sent = halves(live)
        batch.release(sent)
        for row in sent:
            row.restart()
        self.put_back([Unit.alone(row) for row in sent])
        return sent


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
            common = min(shared, common_length(groups[-1][0].prompt_ids, row.prompt_ids))
            widest = max(longest, len(row.prompt_ids))
            if common >= max(MIN_SHARED_PREFIX, widest // 2):
                groups[-1].append(row)
                shared, longest = common, widest
                continue
        groups.append([row])
        shared = longest = len(row.prompt_ids)
    return groups
