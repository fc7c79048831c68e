"""What the engine runs next, decided without touching the model: rows and their progress, units, the running
batch, admission under the row cap and the token budget, and preemption.

The engine carries out what this module decides (forward passes, grammar masks, reading verdicts). Every decision
here depends on the requests and the settings alone, never on timing, so a rerun forms the same batches and gives
the same rows.

One progress model for every row, as vLLM's v1 scheduler keeps it: a row's tokens are its prompt and its output so
far, `computed` of them have their keys and values in its slot, and the rest (`pending`) go into its next pass. A
stored prefix copied into its slot, a shared prefix copied from the row that computed it, a prompt's remainder, a
pick and the tokens its grammar forces after it: each only moves `computed` or lengthens the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local.memory import halves
from offline_sumscore.engine.local.prefix_store import MIN_SHARED_PREFIX, common_length


@dataclass
class Row:
    ticket: int  # the feed's ticket for its request
    request: StageRequest
    prompt: str  # rendered with the chat template once, kept for the result's audit
    prompt_ids: list[int]
    cap: int  # output tokens allowed (0 for a likelihood row)
    calls: int = 1  # requests handed over together with this one (the result's batch_size)
    score_from: int | None = None  # likelihood rows: index in prompt_ids of the continuation's first token
    out: list[int] = field(default_factory=list)  # every token after the prompt (decoded and forced)
    computed: int = 0  # tokens of prompt_ids + out whose keys and values are in its slot
    matcher: Any = None  # its grammar's state (llguidance)
    decoded: int = 0  # of out: picked from the judge's distribution
    forced: int = 0  # of out: fixed by the grammar
    choice_probs: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # likelihood rows: each continuation token's, in order
    expected: list[tuple[int, float]] = field(default_factory=list)  # and the most expected token there, its own
    context: Any = None  # drafts.NgramIndex of prompt_ids + out, built when the row first drafts
    slot: int | None = None  # its KV slot in the running batch
    admitted: int = 0  # its place in the order of admission
    started: float = 0.0
    done: bool = False
    error: str | None = None
    error_kind: str | None = None  # see StageResult.error_kind

    @property
    def pending(self) -> list[int]:
        """Its tokens not yet computed: what its next pass feeds."""
        n = len(self.prompt_ids)
        if self.computed >= n:
            return self.out[self.computed - n :]
        return self.prompt_ids[self.computed :] + self.out

    def fail(self, kind: str, message: str) -> None:
        self.done, self.error_kind, self.error = True, kind, message

    def restart(self) -> None:
        """Back to its prompt: a preempted row is rerun from scratch (greedy decoding makes the rerun identical)."""
        self.matcher, self.context = None, None
        self.out, self.choice_probs = [], []
        self.decoded = self.forced = self.computed = 0

    @property
    def feed_from(self) -> int:
        """Tokens from here on are read: the last prompt token of a row that generates, the token before the
        continuation of a likelihood row. A shared prefix ends before it."""
        return len(self.prompt_ids) - 1 if self.score_from is None else self.score_from - 1


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
        return len(self.prefix) + sum(len(r.prompt_ids) - len(self.prefix) + min(r.cap, 256) for r in self.rows)


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
            row.slot, row.admitted = slot, self.admitted
            self.admitted += 1
            self.rows[slot] = row

    def release(self, rows: list[Row]) -> None:
        """Free the slots of these rows (finished, or sent back to wait); a forming unit forgets them."""
        self.cache.release([r.slot for r in rows])
        for r in rows:
            self.rows[r.slot], r.slot = None, None
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
