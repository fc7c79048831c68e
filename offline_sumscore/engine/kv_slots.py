"""The running batch's keys, values and attention mask, in buffers allocated ahead and written by index.

transformers' DynamicCache concatenates every layer's keys and values on every forward pass, which copies the whole
cache each step (a cost that grows with the batch and its length), and it grows layer by layer during the pass,
so an error raised halfway (out of memory in layer 12) leaves the layers out of step with each other and with the
mask. KVSlots keeps, per layer, one buffer [rows, kv heads, columns, head dim] and one mask [rows, columns] with
room to spare; the committed window is columns [start, end). A forward pass:

    full_mask = slots.begin(new_mask)   # the new columns' mask, written past the window
    model(..., attention_mask=full_mask, cache=slots)   # each layer writes its new keys and values there
    slots.commit()                      # only now does the window take the new columns

so a pass that raises leaves the window as it was (abort() forgets the written columns), whichever layer it raised
in. Columns are shared by all rows: a row that joins later is left-padded with masked columns, and rows that leave
keep their slot until compact() gathers the live rows to the front. When full, buffers grow (one copy, amortised):
rows double up to the engine's row limit, columns grow by a quarter at least, with a quarter of the width kept free
on the left for later joins; trim() drops leading columns no row attends by moving `start` (no copy).

Masked columns hold zeros or old finite values, never uninitialised memory: a masked key gets weight 0, but 0 x NaN
is NaN, so a NaN there would poison every row that reads the slot's value. The buffers themselves are allocated
uninitialised, and each region is zeroed or written as it enters the window (a pass writes its columns for every
row; add_rows, join and open_columns zero what they do not write): on a CPU, memory is paid for when first touched
(page faults, 0.4 to 1 GB/s on the 2-core machine), so capacity that is never used costs nothing, and a CPU batch
takes its row capacity at the engine's row limit from the start instead of growing into it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

_ROW_STEP = 8  # rows are allocated in multiples of this
_COL_STEP = 64  # columns likewise


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device without a synchronisation: copied from pinned memory, asynchronously (a copy
    from pageable memory waits for the device)."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


class _SlotLayer(DynamicLayer):
    """One decoder layer's view of the shared buffers."""

    def __init__(self, slots: KVSlots, index: int):
        super().__init__()
        self.slots, self.index = slots, index
        self.is_initialized = True

    @property
    def keys(self):  # transformers reads layer.keys in a few helpers; the committed window
        s = self.slots
        return s.key_buffers[self.index][: s.rows, :, s.start : s.end]

    @keys.setter
    def keys(self, value):  # DynamicLayer.__init__/reset assign; the buffers are the slots' own
        pass

    @property
    def values(self):
        s = self.slots
        return s.value_buffers[self.index][: s.rows, :, s.start : s.end]

    @values.setter
    def values(self, value):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        s = self.slots
        w = key_states.shape[2]
        if w != s.pending or key_states.shape[0] != s.rows:
            raise RuntimeError(
                f"KVSlots: layer {self.index} got {key_states.shape[0]} rows x {w} columns, "
                f"expected {s.rows} x {s.pending} (call begin() before the pass)"
            )
        k, v = s.key_buffers[self.index], s.value_buffers[self.index]
        k[: s.rows, :, s.end : s.end + w] = key_states
        v[: s.rows, :, s.end : s.end + w] = value_states
        return k[: s.rows, :, s.start : s.end + w], v[: s.rows, :, s.start : s.end + w]

    def get_seq_length(self) -> int:
        return self.slots.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slots.width + query_length, 0

    def reset(self) -> None:
        raise NotImplementedError("KVSlots are never reset; make new ones")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("KVSlots are never cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("use KVSlots.select")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("use KVSlots.select")


class KVSlots(Cache):
    """A transformers Cache whose layers write by index into preallocated buffers (see the module docstring)."""

    def __init__(self, config, *, dtype, device, rows: int = 0, columns: int = 0, row_limit: int | None = None):
        layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.dtype, self.device = dtype, torch.device(device)
        self.row_limit = row_limit  # rows double when full, up to this many (the engine's bound on a batch's rows)
        super().__init__(layers=[_SlotLayer(self, i) for i in range(layers)])
        self.rows = self.start = self.end = self.pending = 0
        # Host copy of each row's first attended column (window coordinates; None: none yet), so that finding the
        # columns no row attends never reads the mask back from the device.
        self.first: list[int | None] = []
        self._pending_first: list[int | None] = []
        self.key_buffers: list[torch.Tensor] = []
        self.value_buffers: list[torch.Tensor] = []
        self.mask_buffer = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.reallocations = 0
        self._reallocate(rows, columns, 0)

    # -- shape ---------------------------------------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.end - self.start

    @property
    def mask(self) -> torch.Tensor:
        return self.mask_buffer[: self.rows, self.start : self.end]

    @property
    def capacity(self) -> tuple[int, int]:
        return tuple(self.mask_buffer.shape)

    def _reallocate(self, rows: int, columns: int, left: int) -> None:
        """New buffers of at least rows x (left + columns); the window moves to start at column `left`. Every new
        buffer is allocated before any is swapped in, so running out of memory here changes nothing."""
        if self.device.type == "cpu" and self.row_limit:  # untouched rows cost nothing there (module docstring)
            rows = max(rows, self.row_limit)
        rows = -(-max(rows, 1) // _ROW_STEP) * _ROW_STEP
        cols = -(-max(left + columns, 1) // _COL_STEP) * _COL_STEP
        shape = (rows, self.kv_heads, cols, self.head_dim)
        keys = [self._uninitialised(shape) for _ in self.layers]
        values = [self._uninitialised(shape) for _ in self.layers]
        mask = torch.zeros((rows, cols), dtype=torch.long, device=self.device)
        n, w = self.rows, self.width
        if n and w:
            for new, old in zip(keys + values, self.key_buffers + self.value_buffers):
                new[:n, :, left : left + w] = old[:n, :, self.start : self.end]
            mask[:n, left : left + w] = self.mask_buffer[:n, self.start : self.end]
        self.key_buffers, self.value_buffers, self.mask_buffer = keys, values, mask
        self.start, self.end = left, left + w
        self.reallocations += 1

    def _uninitialised(self, shape) -> torch.Tensor:
        """A buffer whose every region is zeroed or written before it enters the window (module docstring)."""
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _zero_kv(self, rows: slice, columns: slice) -> None:
        for buf in self.key_buffers + self.value_buffers:
            buf[rows, :, columns] = 0

    def reserve(self, rows: int, new_columns: int = 0, left: int = 0) -> None:
        """Room for `rows` rows, `new_columns` columns after the window and `left` before it."""
        have_rows, have_cols = self.capacity
        if rows <= have_rows and self.end + new_columns <= have_cols and self.start >= left:
            return
        # A reallocation copies the cache into fresh memory, and on a CPU the first touch of fresh memory costs more
        # than the copy (page faults: 0.4 to 1 GB/s measured on the 2-core machine, where a batch's growth by a
        # quarter at a time cost a quarter of a 24-sample run). So rows double, up to the engine's row limit, and a
        # live batch keeps a quarter of its width free on the left, where the next wider join lands.
        if rows > have_rows:
            doubled = min(2 * have_rows, self.row_limit) if self.row_limit else 2 * have_rows
            grow_rows = max(rows, doubled)
        else:
            grow_rows = have_rows
        if self.rows:
            slack = (self.width + new_columns) // 4
            left = max(left, min(self.start, slack)) if self.start >= left else left + slack
        need = left + self.width + new_columns
        grow_cols = max(need, have_cols + have_cols // 4) if need > have_cols else have_cols
        self._reallocate(grow_rows, grow_cols - left, left)

    # -- one forward pass ----------------------------------------------------------------------------------
    def begin(self, new_mask, device_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Room for the pass's columns and their mask; returns the mask the pass attends with ([rows, width + new]).
        new_mask: a numpy array on the host (read here for each row's first attended column); device_mask: the
        same on the device, when the caller has copied it already."""
        if self.pending:
            raise RuntimeError("KVSlots: a pass is already open (commit() or abort() it first)")
        rows, w = new_mask.shape
        if rows != self.rows:
            raise RuntimeError(f"KVSlots: a pass over {rows} rows on slots holding {self.rows}")
        self.reserve(rows, w)
        if device_mask is None:
            device_mask = torch.from_numpy(new_mask).to(self.device)
        self.mask_buffer[:rows, self.end : self.end + w] = device_mask
        self.pending = w
        width, host = self.width, new_mask
        seen, at = host.any(axis=1), host.argmax(axis=1)
        self._pending_first = [
            f if f is not None or not seen[r] else width + int(at[r]) for r, f in enumerate(self.first)
        ]
        return self.mask_buffer[:rows, self.start : self.end + w]

    def commit(self) -> None:
        if self.pending:
            self.first = self._pending_first
        self.end += self.pending
        self.pending = 0

    def abort(self) -> None:
        """Forget the open pass: its columns lie outside the window, and the next pass overwrites them."""
        self.pending = 0

    # -- rows ----------------------------------------------------------------------------------------------
    def add_rows(self, n: int) -> None:
        """n new rows with nothing attended yet (a fresh cache's rows, before their first pass)."""
        self.reserve(self.rows + n)
        self.mask_buffer[self.rows : self.rows + n, self.start : self.end] = 0
        self._zero_kv(slice(self.rows, self.rows + n), slice(self.start, self.end))
        self.rows += n
        self.first += [None] * n

    def select(self, index: list[int]) -> None:
        """Row i becomes old row index[i] (a fork repeats rows; a compaction keeps the live ones)."""
        n = len(index)
        self.reserve(n)
        if self.width and n and _is_fork(index):
            # Each source row copied into its own run of rows, the last run first: a run never starts before its
            # source row, so no source is overwritten before it is read, and no temporary copy of the cache is made.
            s, e = self.start, self.end
            runs = _runs(index)
            for src, a, b in reversed(runs):
                a = max(a, src + 1) if a <= src < b else a
                if a < b:
                    self._copy_rows(slice(a, b), slice(src, src + 1), slice(s, e), slice(s, e))
        elif self.width and n and all(b > a for a, b in zip(index, index[1:])):
            # A compaction: each run of kept rows moves up to its new place in blocks no longer than the distance
            # it moves (a block never overlaps its source), with no temporary copy of the cache. Keys and values
            # are moved only from the first column a kept row attends (the columns before it are masked for every
            # kept row, and trim() drops them), the mask whole.
            attended = [self.first[i] for i in index if self.first[i] is not None]
            s, e = self.start + min(attended, default=0), self.end
            for src, dst, length in _moves(index):
                for k in range(0, length, src - dst):
                    block = min(src - dst, length - k)
                    to, of = slice(dst + k, dst + k + block), slice(src + k, src + k + block)
                    self._copy_rows(to, of, slice(s, e), slice(self.start, e))
        elif self.width and n:
            at = to_device(torch.tensor(index, dtype=torch.long), self.device)
            for buf in self.key_buffers + self.value_buffers:
                buf[:n, :, self.start : self.end] = buf[:, :, self.start : self.end].index_select(0, at)
            self.mask_buffer[:n, self.start : self.end] = self.mask_buffer[:, self.start : self.end].index_select(0, at)
        self.rows = n
        self.first = [self.first[i] for i in index]

    def _copy_rows(self, to: slice, of: slice, kv_columns: slice, mask_columns: slice) -> None:
        """Rows `of` into rows `to` (one source row broadcasts to many) in every layer's keys and values, and in
        the mask. The two row ranges must not overlap (torch refuses a copy within overlapping memory)."""
        for buf in self.key_buffers + self.value_buffers:
            buf[to, :, kv_columns] = buf[of, :, kv_columns]
        self.mask_buffer[to, mask_columns] = self.mask_buffer[of, mask_columns]

    def join(self, other: KVSlots) -> None:
        """Append other's rows; the narrower window is left-padded with masked columns."""
        m, a, b = other.rows, self.width, other.width
        extra = max(0, b - a)
        self.reserve(self.rows + m, 0, left=extra)
        if extra:  # the old rows gain masked columns on the left (they may hold stale mask bits from a trim)
            self.mask_buffer[: self.rows, self.start - extra : self.start] = 0
            self._zero_kv(slice(0, self.rows), slice(self.start - extra, self.start))
            self.start -= extra
            self.first = [f + extra if f is not None else None for f in self.first]
        w = self.width
        rows = slice(self.rows, self.rows + m)
        self.mask_buffer[rows, self.start : self.end - b] = 0
        self._zero_kv(rows, slice(self.start, self.end - b))
        self.mask_buffer[rows, self.end - b : self.end] = other.mask
        for mine, theirs in zip(self.key_buffers + self.value_buffers, other.key_buffers + other.value_buffers):
            mine[rows, :, self.end - b : self.end] = theirs[:m, :, other.start : other.end]
        self.rows += m
        self.first += [w - b + f if f is not None else None for f in other.first]

    def trim(self) -> None:
        """Drop the leading columns of the window that no row attends (rows that attended them have left)."""
        cut = min((f for f in self.first if f is not None), default=self.width)
        self.start += cut
        self.first = [f - cut if f is not None else None for f in self.first]

    def row_kv(self, row: int, columns: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of one row's keys and values at the given window columns, per layer ([1, heads, n, dim])."""
        at = columns + self.start
        return [
            (k[row : row + 1, :, at].clone(), v[row : row + 1, :, at].clone())
            for k, v in zip(self.key_buffers, self.value_buffers)
        ]

    def write_row(self, row: int, kv: list, n: int) -> None:
        """Stored keys and values of n tokens into the last n columns of a row's window."""
        for k, v, (k0, v0) in zip(self.key_buffers, self.value_buffers, kv):
            k[row, :, self.end - n : self.end] = k0[0, :, :n]
            v[row, :, self.end - n : self.end] = v0[0, :, :n]
        self.mask_buffer[row, self.end - n : self.end] = 1
        at = self.width - n
        self.first[row] = at if self.first[row] is None else min(self.first[row], at)

    def open_columns(self, n: int) -> None:
        """Widen the window by n masked columns (room for stored prefixes written by write_row)."""
        self.reserve(self.rows, n)
        self.mask_buffer[: self.rows, self.end : self.end + n] = 0
        self._zero_kv(slice(0, self.rows), slice(self.end, self.end + n))
        self.end += n


def _is_fork(index: list[int]) -> bool:
    """Non-decreasing, each row at or after its source, every source row from 0 on kept (a fork of the rows)."""
    return (
        bool(index)
        and index[0] == 0
        and all(b - a in (0, 1) for a, b in zip(index, index[1:]))
        and any(b == a for a, b in zip(index, index[1:]))
    )


def _runs(index: list[int]) -> list[tuple[int, int, int]]:
    """(source row, first row, end) for each run of equal values."""
    runs, a = [], 0
    for k in range(1, len(index) + 1):
        if k == len(index) or index[k] != index[a]:
            runs.append((index[a], a, k))
            a = k
    return runs


def _moves(index: list[int]) -> list[tuple[int, int, int]]:
    """A strictly increasing index as (source row, new row, length) for each run of consecutive rows that moves."""
    moves, a = [], 0
    for k in range(1, len(index) + 1):
        if k == len(index) or index[k] != index[k - 1] + 1:
            if index[a] != a:
                moves.append((index[a], a, k - a))
            a = k
    return moves


def grouped_query_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """scaled_dot_product_attention for grouped-query models without expanding the keys and values.

    transformers' SDPA path repeats every layer's keys and values once per query head of a group whenever a mask
    is given (to stay on CUDA's fused kernels), which copies the whole cache again each step. Here the query heads
    of a group are stacked along the query axis instead ([rows, kv heads, group x queries, dim]) and the mask is
    repeated along that axis: the small tensors are copied, not the cache."""
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    mask = attention_mask[:, :, :, :keys] if attention_mask is not None else None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if mask is None and causal and queries > 1:  # no mask given: causal, the queries being the last positions
        mask = torch.ones((queries, keys), dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
    if group > 1:
        query = query.reshape(rows, kv_heads, group * queries, dim)
        if mask is not None:
            mask = mask.expand(mask.shape[0], 1, queries, keys).repeat(1, 1, group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    out = out.reshape(rows, heads, queries, dim).transpose(1, 2).contiguous()
    return out, None


ATTENTION = "offline_sumscore_gqa_sdpa"


def register_attention() -> str:
    """Register grouped_query_sdpa with transformers (with SDPA's boolean masks); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, grouped_query_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
