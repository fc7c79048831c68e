"""The running batch's keys and values: one slot per row, in buffers allocated ahead and written by index.

transformers' DynamicCache concatenates every layer's keys and values on every forward pass, which copies the whole
cache each step (a cost that grows with the batch and its length), and it grows layer by layer during the pass,
so an error raised halfway (out of memory in layer 12) leaves the layers out of step with each other. KVSlots keeps,
per layer, one buffer [slots, kv heads, columns, head dim]. Row r's tokens lie left-aligned in its slot, in columns
[0, filled[r]); nothing else marks them, so no mask is kept. A forward pass is ragged: each row feeds only its own
tokens (none, one, a draft, a prompt), all the pass's tokens as one flat [1, tokens] sequence, and each token is
written after its row's last one:

    layout = slots.begin(counts)        # row r feeds counts[r] tokens; where each goes, what each attends
    model(..., cache=slots, ragged_pass=layout)   # each layer writes its tokens' keys and values there
    slots.commit()                      # only now do the rows' lengths take the new tokens

so a pass that raises leaves every row as it was (abort() forgets the written columns, which lie past the rows'
lengths), whichever layer it raised in. A pass has no holes: a row that feeds nothing costs nothing, and the
dense layers see the real tokens only. Tokens a row gives back after a pass (draft tokens the judge did not pick,
give_back()) are simply written over by its next pass.

Rows come and go without moving the others: a row that finishes frees its slot (release()), a new row takes the lowest
free slot (place()), its stored prefix written in (write()) or taken from a sibling that computed it (fork(): on a CPU
the prefix's whole pages are mapped from one copy into every row's slot, shared_pages.py, and the rest copied; elsewhere
copied). A pass's attention spans columns [0, stop) of slots [0, rows), so those columns hold finite values for every
slot, never uninitialised memory: a masked key gets weight 0, but 0 x NaN is NaN. On a device the buffers are allocated
uninitialised and zeroed as slots and columns enter that span. On a CPU they are fresh anonymous mappings of the
kernel's zero page (zero_pages): every byte reads 0 until written, and a page is paid for only when first written (page
faults, 0.4 to 1 GB/s on the 2-core machine), so nothing is zeroed, and a slot's columns past its row's tokens cost
nothing however wide the span. Zeroing them, as before, touched every slot ever spanned across the widest row ever
spanned: with the 1.5B, one 2,559-word source among short rows kept 64 slots of its width resident. A CPU batch takes
its slot capacity at the engine's row limit from the start.

On a device of bounded memory (a GPU; capacity.py) the slots follow the rows actually live: they claim every shape
from the engine's KVBudget before allocating it, grow to what a pass or an admission needs, and shrink when rows
leave (a set more than twice as large as its rows need is laid out again). Buffers are replaced one at a time, each
old one freed once copied, so a change holds at most one buffer more than the larger of the two sets, and the budget
keeps that buffer spare; a set allocated whole before the old one went held both, and on a GPU at its limit that
allocation could never succeed, so its rows were halved and admitted again forever.
"""

from __future__ import annotations

import math
import mmap
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from offline_sumscore.engine.local.attention import CPU_CALLS, CallRule, RaggedPass, runs
from offline_sumscore.engine.local.kv_budget import KVBudget, KVBudgetExceeded
from offline_sumscore.engine.local.shared_pages import SlotPrefixes

_ROW_STEP = 8  # slots are allocated in multiples of this
COLUMN_STEP = 64  # columns likewise; what the scheduler and a likelihood pack plan with too (padded_columns)


def padded_columns(columns: int) -> int:
    """The columns a slot set allocates for `columns` (at least one step of them)."""
    return -(-max(columns, 1) // COLUMN_STEP) * COLUMN_STEP


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one token's keys and values in a model: what sizes the cache, the engine's token budget and the
    benchmark's memory floor."""

    layers: int
    kv_heads: int
    head_dim: int
    element_bytes: int

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> KVGeometry:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, heads, head_dim, torch.finfo(dtype).bits // 8)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.element_bytes


class _SlotLayer(DynamicLayer):
    """One decoder layer's view of the shared buffers. It holds the slots weakly: a strong reference back would make
    a cycle, and the slots' buffers (gigabytes) would then wait for the cyclic garbage collector to be freed, which
    on a long run is never soon enough (measured: 24 GB held after three runs of the ladder)."""

    def __init__(self, slots: KVSlots, index: int):
        super().__init__()
        self._slots, self.index = weakref.ref(slots), index
        self.is_initialized = True

    @property
    def slots(self) -> KVSlots:
        return self._slots()

    @property
    def keys(self):  # transformers reads layer.keys in a few helpers
        s = self.slots
        return s.key_buffers[self.index][: s.rows, :, : s.width]

    @keys.setter
    def keys(self, value):  # DynamicLayer.__init__/reset assign; the buffers are the slots' own
        pass

    @property
    def values(self):
        s = self.slots
        return s.value_buffers[self.index][: s.rows, :, : s.width]

    @values.setter
    def values(self, value):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states, value_states: [1, kv heads, tokens, dim], the open pass's tokens in order."""
        s, p = self.slots, self.slots.open
        if p is None:
            raise RuntimeError("KVSlots: a forward pass outside begin()/commit()")
        if key_states.shape[0] != 1 or key_states.shape[2] != p.tokens:
            raise RuntimeError(
                f"KVSlots: layer {self.index} got {tuple(key_states.shape)}, expected one row of {p.tokens} tokens"
            )
        k, v = s.key_buffers[self.index], s.value_buffers[self.index]
        k[p.row_index, :, p.column_index] = key_states[0].transpose(0, 1)
        v[p.row_index, :, p.column_index] = value_states[0].transpose(0, 1)
        return k[: s.rows, :, : p.stop], v[: s.rows, :, : p.stop]

    def get_seq_length(self) -> int:
        return self.slots.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        p = self.slots.open
        return (p.stop if p is not None else self.slots.width + query_length), 0

    def reset(self) -> None:
        raise NotImplementedError("KVSlots are never reset; make new ones")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KVSlots are never cropped; use give_back")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("use KVSlots.fork")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("use KVSlots.release")


class KVSlots(Cache):
    """A transformers Cache whose layers write each row's tokens into its own slot (see the module docstring)."""

    def __init__(
        self,
        config,
        *,
        dtype,
        device,
        rows: int = 0,
        columns: int = 0,
        row_limit: int | None = None,
        budget: KVBudget | None = None,
        exact: bool = False,
        call_rule: CallRule = CPU_CALLS,
    ):
        """budget: the engine's KVBudget on a device of bounded memory (every shape claimed from it first); None on
        a CPU. exact: slots allocated as asked, not in multiples of 8 (always so with a budget). call_rule: how a
        pass's attention is cut into calls on this device (attention.py)."""
        geometry = KVGeometry.of(config, dtype)
        layers, self.kv_heads, self.head_dim = geometry.layers, geometry.kv_heads, geometry.head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.row_limit = row_limit  # slots double when full, up to this many (the engine's bound on a batch's rows)
        self.budget, self.exact = budget, exact or budget is not None
        self.call_rule = call_rule
        if budget is not None:  # a set dropped without free() gives its claim back when it is collected
            weakref.finalize(self, budget.drop, id(self))
        super().__init__(layers=[_SlotLayer(self, i) for i in range(layers)])
        self.rows = 0  # slots [0, rows) may hold a row; a pass spans them all
        self.filled: list[int] = []  # each slot's tokens (0 for a free slot)
        self.used: list[bool] = []
        self.clean = 0  # columns [0, clean) of slots [0, finite) hold finite values
        self.finite = 0  # slots that ever entered the span: they keep finite values after their rows leave
        self.open: RaggedPass | None = None
        self.prefixes = SlotPrefixes()  # on a CPU, each slot's prefix mapped from one copy (fork)
        self.key_buffers: list[torch.Tensor] = []
        self.value_buffers: list[torch.Tensor] = []
        self.reallocations = 0
        self._capacity = (0, 0)
        self._reallocate(rows, columns)

    # -- shape ---------------------------------------------------------------------------------------------
    @property
    def width(self) -> int:
        """Columns attended by some row: the longest row."""
        return max(self.filled, default=0)

    @property
    def capacity(self) -> tuple[int, int]:
        """Slots and columns every buffer holds."""
        return self._capacity

    def _reallocate(self, rows: int, columns: int) -> None:
        """Buffers of at least rows x columns, replaced one at a time (the module docstring): each new one
        allocated, what the old one holds copied in, the old one freed. Out of memory part-way leaves some buffers
        changed and some not, each holding what it held: capacity is what all of them hold, and nothing is lost."""
        if self.budget is None and self.device.type == "cpu" and self.row_limit:
            rows = max(rows, self.row_limit)  # untouched slots cost nothing there (module docstring)
        step = 1 if self.exact else _ROW_STEP  # a bounded device pays for every slot it allocates
        rows = -(-max(rows, 1) // step) * step
        cols = padded_columns(columns)
        if self.budget is not None:
            self.budget.claim(
                self, rows * cols, self._capacity[0] * self._capacity[1], f"{rows} slots x {cols} columns"
            )
        shape = (rows, self.kv_heads, cols, self.head_dim)
        keep = (min(self.finite, rows), min(self.clean, cols))
        if not self.key_buffers:
            self.key_buffers, self.value_buffers = [None] * len(self.layers), [None] * len(self.layers)
        try:
            for first, buffers in ((0, self.key_buffers), (len(self.layers), self.value_buffers)):
                for i, old in enumerate(buffers):
                    new = self._uninitialised(shape)
                    if old is not None and all(keep):
                        self._carry(old, new, keep, first + i)
                    buffers[i], old = new, None  # the old buffer goes now, before the next is allocated
        finally:
            shapes = [b.shape for b in self.key_buffers + self.value_buffers if b is not None]
            self._capacity = (min(s[0] for s in shapes), min(s[2] for s in shapes)) if shapes else (0, 0)
            self.finite, self.clean = min(self.finite, self._capacity[0]), min(self.clean, self._capacity[1])
            if self.budget is not None:  # what the buffers hold now, however far the change went
                held = sum(s[0] * s[2] for s in shapes) // max(len(shapes), 1)
                self.budget.held[id(self)] = max(held, self._capacity[0] * self._capacity[1])
        self.reallocations += 1

    def _carry(self, old: torch.Tensor, new: torch.Tensor, keep: tuple[int, int], index: int) -> None:
        """What a replaced buffer (number `index` of keys then values) holds that the new one must: on zero pages,
        each live row's tokens (whatever else reads 0 there, and copying the rest would make every slot of the span
        resident at its widest), a shared prefix mapped again rather than copied; elsewhere the whole region known
        to hold finite values."""
        if not self.zero_filled:
            new[: keep[0], :, : keep[1]] = old[: keep[0], :, : keep[1]]
            return
        for slot in range(min(self.rows, keep[0])):
            n = min(self.filled[slot], keep[1])
            if self.used[slot] and n:
                start = self.prefixes.carry(index, new, slot, n)  # the columns mapped again
                new[slot, :, start:n] = old[slot, :, start:n]

    def free(self) -> None:
        """Every buffer goes, and its claim on the budget with it: this set is not used again."""
        self.key_buffers, self.value_buffers, self._capacity = [], [], (0, 0)
        self.prefixes.close()
        self.finite = self.clean = 0
        if self.budget is not None:
            self.budget.drop(id(self))

    @property
    def zero_filled(self) -> bool:
        """Buffers that read 0 wherever they were never written: a CPU's (zero_pages), not a bounded device's."""
        return self.device.type == "cpu" and self.budget is None

    def _uninitialised(self, shape) -> torch.Tensor:
        """A buffer whose every region is zero or written before a pass attends it (module docstring)."""
        if self.zero_filled:
            return zero_pages(shape, self.dtype)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def reserve(self, rows: int, columns: int) -> None:
        """Room for `rows` slots of `columns` columns. A reallocation copies the cache into fresh memory, and on a
        CPU the first touch of fresh memory costs more than the copy (the module docstring), so slots double, up to
        the engine's row limit, and columns grow by a quarter at least."""
        have_rows, have_cols = self.capacity
        if rows <= have_rows and columns <= have_cols:
            return
        need = (max(rows, self.rows), max(columns, self.width))
        if rows > have_rows:
            doubled = min(2 * have_rows, self.row_limit) if self.row_limit else 2 * have_rows
            rows = max(rows, doubled)
        else:
            rows = have_rows
        columns = max(columns, have_cols + have_cols // 4) if columns > have_cols else have_cols
        if self.budget is None:
            self._reallocate(rows, columns)
            return
        try:  # room to grow into where the budget has it; else exactly what the rows need (capacity.KVBudget)
            self._reallocate(rows, columns)
        except KVBudgetExceeded:
            if (rows, columns) == need:
                raise
            self._reallocate(*need)

    def _shrink(self, columns: int) -> None:
        """On a bounded device, a set more than twice what its rows and this pass need is laid out again, smaller,
        so that the budget it held serves other shapes. Never needed for correctness: a refusal is ignored."""
        have_rows, have_cols = self.capacity
        rows, cols = max(self.rows, 1), max(columns, self.width, COLUMN_STEP)
        if have_rows <= 2 * rows and have_cols <= 2 * cols:
            return
        try:
            self._reallocate(min(have_rows, rows + rows // 4), min(have_cols, cols + cols // 4))
        except torch.OutOfMemoryError:
            pass

    def _span(self, rows: int, columns: int) -> None:
        """Slots [0, rows) and columns [0, columns) enter the attended span: room for them, and finite values in
        every part of it not yet known to hold them. A slot that was in the span before (its row left, another
        takes it) still holds finite values, so it is not zeroed again: the likelihood path empties its slots for
        every group of rows, and would otherwise zero them all each time."""
        # A CPU keeps every column it ever zeroed; a bounded device asks for the columns its rows hold.
        self.reserve(max(rows, self.rows), max(columns, self.clean if self.budget is None else self.width))
        if rows > self.rows:
            if rows > self.finite:
                self._zero(slice(self.finite, rows), slice(0, self.clean))
                self.finite = rows
            self.filled += [0] * (rows - self.rows)
            self.used += [False] * (rows - self.rows)
            self.rows = rows
        if columns > self.clean:
            self._zero(slice(0, self.finite), slice(self.clean, columns))
            self.clean = columns

    def _zero(self, rows: slice, columns: slice) -> None:
        if self.zero_filled:
            return  # never written there since it was mapped: it reads 0, and writing zeros would make it resident
        if rows.stop > rows.start and columns.stop > columns.start:
            for buf in self.key_buffers + self.value_buffers:
                buf[rows, :, columns] = 0

    # -- rows ----------------------------------------------------------------------------------------------
    def place(self, n: int) -> list[int]:
        """n free slots for new rows, the lowest first (deterministic: it depends on which rows left, not when)."""
        free = [r for r in range(self.rows) if not self.used[r]][:n]
        if len(free) < n:
            start = self.rows
            self._span(start + n - len(free), self.clean if self.budget is None else self.width)
            free += list(range(start, start + n - len(free)))
        for r in free:
            self.used[r], self.filled[r] = True, 0
        return free

    def release(self, slots: list[int]) -> None:
        """The rows in these slots have finished: the slots are free (what they hold stays, finite, unattended,
        but a shared prefix, which goes back to zero pages)."""
        for r in slots:
            self.prefixes.unshare(self.key_buffers + self.value_buffers, r)
            self.used[r], self.filled[r] = False, 0
        while self.rows and not self.used[self.rows - 1]:
            self.rows -= 1
            self.filled.pop()
            self.used.pop()

    def empty(self, row_limit: int | None = None) -> None:
        """No rows, no open pass: ready for another run (its buffers kept, zeroed where they were attended)."""
        self.abort()
        self.release(list(range(self.rows)))
        self.row_limit = row_limit if row_limit is not None else self.row_limit

    def write(self, slot: int, kv, n: int) -> None:
        """Stored keys and values of n tokens as the slot's first n: a prefix store's StoredKV (copied from its
        blocks straight into the slot), or per layer ([1, kv heads, >= n, dim], same)."""
        self._span(self.rows, n)
        self.prefixes.unshare(self.key_buffers + self.value_buffers, slot)
        if hasattr(kv, "copy_into"):
            for layer, (k, v) in enumerate(zip(self.key_buffers, self.value_buffers)):
                kv.copy_into(layer, k[slot], v[slot], n)
        else:
            for k, v, (k0, v0) in zip(self.key_buffers, self.value_buffers, kv):
                k[slot, :, :n] = k0[0, :, :n]
                v[slot, :, :n] = v0[0, :, :n]
        self.filled[slot] = n

    def fork(self, source: int, slots: list[int], n: int) -> None:
        """The first n tokens of the source slot into each of the slots (a shared prefix computed once): on a CPU
        their whole pages mapped from one copy (shared_pages.py), the rest copied."""
        if slots and n:
            done = self.prefixes.share(self.key_buffers + self.value_buffers, source, slots, n, self.zero_filled)
            spans = runs(sorted(slots))
            for buf in self.key_buffers + self.value_buffers:
                for a, b in spans:
                    buf[a:b, :, done:n] = buf[source : source + 1, :, done:n]
        for r in slots:
            self.filled[r] = n

    def row_views(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The slot's keys and values per layer as views ([1, kv heads, columns, dim]): read them before the next
        pass writes the slot."""
        return [(k[slot : slot + 1], v[slot : slot + 1]) for k, v in zip(self.key_buffers, self.value_buffers)]

    # -- one forward pass ----------------------------------------------------------------------------------
    def begin(self, counts: list[int]) -> RaggedPass:
        """Room for a pass in which slot r feeds counts[r] tokens (0: none; one count per slot in [0, rows));
        returns its layout, which ragged_attention reads."""
        if self.open is not None:
            raise RuntimeError("KVSlots: a pass is already open (commit() or abort() it first)")
        if len(counts) != self.rows:
            raise RuntimeError(f"KVSlots: a pass over {len(counts)} rows on slots holding {self.rows}")
        filled = np.asarray(self.filled, dtype=np.int64)
        feed = np.asarray(counts, dtype=np.int64)
        if (feed[~np.asarray(self.used, dtype=bool)] > 0).any():
            raise RuntimeError("KVSlots: a pass feeds a free slot")
        for slot, columns in self.prefixes.columns(self.key_buffers).items():
            if feed[slot] and filled[slot] < columns:  # its pass would write into pages other rows read
                raise RuntimeError(f"KVSlots: slot {slot} would write into its shared prefix ({columns} columns)")
        layout = RaggedPass(filled, feed, self.device, calls=self.call_rule)
        if self.budget is not None:
            self._shrink(layout.stop)
        self._span(self.rows, layout.stop)
        self.open = layout
        return layout

    def commit(self) -> None:
        if self.open is not None:
            self.filled = [f + int(n) for f, n in zip(self.filled, self.open.counts)]
        self.open = None

    def abort(self) -> None:
        """Forget the open pass: its columns lie past the rows' lengths, and the next pass writes over them."""
        self.open = None

    def give_back(self, returns: list[tuple[int, int]]) -> None:
        """After a committed pass, (slot, n): the row's last n tokens are not its tokens after all (draft tokens
        the judge did not pick); its next pass writes over them."""
        for slot, n in returns:
            self.filled[slot] -= n


def zero_pages(shape, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor on a fresh private anonymous mapping: it reads 0 everywhere, and the kernel gives it a page of
    memory only when that page is first written (reading an unwritten page maps the shared zero page). The mapping
    lives as long as the tensor does (torch.frombuffer holds it) and is unmapped with it."""
    elements = math.prod(int(n) for n in shape)
    nbytes = max(elements * torch.empty((), dtype=dtype).element_size(), 1)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=dtype, count=elements).view(shape)
