"""Attention for ragged passes: where each of a pass's tokens goes in the KV slots and which keys it attends
(RaggedPass), the attention itself (ragged_attention), the grouped-query SDPA the judge runs with outside the
engine's passes, and the check that a model's attention is a kind these compute.

What a layer asks for arrives with its call, as transformers passes it to any attention function: a sliding window
(`sliding_window`: a query attends the keys less than that many positions before it, as Mistral v0.1, Phi-3 and
the local layers of Gemma-2 and Gemma-3 do) and softcapped scores (`softcap`: tanh(score / cap) x cap before the
mask, as Gemma-2 does). Columns are positions (each row lies left-aligned in its slot), so a window is a bound on
columns.

A ragged pass feeds every row's own tokens as one flat [1, tokens] sequence. On a CPU with AVX-512 (float32, no
softcap) every token attends in one call of the attention kernel (engine/cpu/attention_kernel.py): its own slot's
columns up to its own, nothing padded or masked. Elsewhere attention runs through SDPA, as one call over the slots
that feed one token (a decoding step feeds one token a row, so that is usually the whole pass) plus calls for the
slots that feed more (a prefill, a row with a draft or forced tokens). Each call reads the keys of its own slots
only, up to the last column any of them attends (its `stop`), not the whole batch's widest row: a prompt fed
beside long decoding rows attends its own few hundred columns. The slots that feed more are cut into calls by cost
(a device's CallRule): the next such slot joins the call before it while padding the call to one width and stop
costs no more cells (queries x keys) than a call of its own would (call_cells), so a prompt beside a row's
three-token draft is two calls, never a draft padded to the prompt's width. On a CPU only adjacent slots join; on a
GPU (attention_cuda.py), where a call is a kernel launch, slots join across the rows between them, those rows'
queries counted as padding, and a call's queries go in blocks where its mask or scores would be large. A call of
one slot with nothing before its feed (a fresh prompt) is causal as SDPA computes it, with no mask built: its
kernel skips the keys after each query. Masks are additive (0 / -inf) in the queries' dtype; on a CPU made once a
pass (SDPA would turn a boolean mask into that in every layer), on a GPU the runs' at each call, so that no mask of
a whole pass is ever held.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from offline_sumscore.engine.local.transfer import indices


@dataclass(frozen=True)
class CallRule:
    """How a device's SDPA calls are cut (the module docstring): a call's fixed cost in attention cells, below which
    padding is cheaper than another call; whether slots join across the rows between them; past how many cells a
    call's queries go in blocks (None: never); whether the runs' masks are made once a pass or at each call."""

    name: str
    call_cells: int
    across_gaps: bool = False
    block_cells: int | None = None
    cache_run_masks: bool = True


# On a CPU a call costs little beside the cells it computes, and padding costs compute: calls of adjacent slots only.
CPU_CALLS = CallRule("cpu", call_cells=4096)


@dataclass
class Run:
    """Slots [first, end) of which some feed more than one token in a pass, attended in one call (the others, if
    any, pad it): its tokens' places in the flat sequence, each token's slot within the run and its place in its
    block, the block's first place in its row (lo) and widest feed, the columns its slots attend ([0, stop)), and
    whether it is one slot with nothing before its feed (causal as SDPA computes it: no mask needed)."""

    first: int
    end: int
    width: int
    stop: int
    tokens: torch.Tensor
    slot: torch.Tensor
    step: torch.Tensor
    fresh: bool = False
    lo: int = 0


class RaggedPass:
    """Where a pass's tokens go and what each attends (the module docstring): built on the host from each slot's
    length and token count, copied to the device once per pass, read by every layer."""

    def __init__(self, filled: np.ndarray, counts: np.ndarray, device: torch.device, calls: CallRule = CPU_CALLS):
        self.counts, self.filled, self.device, self.calls = counts, filled, device, calls
        self.tokens = int(counts.sum())
        self.stop = int((filled + counts).max(initial=0))  # columns the pass attends
        self.row_of = np.repeat(np.arange(len(counts)), counts)
        self.offsets = np.cumsum(counts) - counts  # each slot's first token in the flat sequence
        self.step_of = np.arange(self.tokens) - np.repeat(self.offsets, counts)  # a token's place in its row
        self.row_index = indices(self.row_of, device)
        self.column_index = indices(filled[self.row_of] + self.step_of, device)
        self.singles = np.flatnonzero(counts == 1)  # the slots feeding one token (decoding rows)
        self.decoding = len(self.singles) == len(counts) > 0  # every slot feeds one token: no gathers at all
        self._masks: dict[tuple, tuple] = {}  # (kv group, window, dtype, softcap) -> the pass's masks
        # The attention kernel (attention_kernel.py), set by the pass that runs this layout where it applies: every
        # token reads its own slot's columns in one call, no runs, no grid, no mask.
        self.kernel = None

    @cached_property
    def kernel_rows(self) -> torch.Tensor:
        """The rows as the kernel reads them: (slot, first token, tokens, columns before them) for each slot that
        feeds a token, host int64 [rows, 4]."""
        fed = np.flatnonzero(self.counts > 0)
        rows = np.stack([fed, self.offsets[fed], self.counts[fed], self.filled[fed]], axis=1)
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

    @cached_property
    def single(self) -> tuple | None:
        """SDPA's single call, over the slots that feed one token: (each such slot's place in the span [a, b), its
        token's place in the pass), device tensors; None where no slot feeds one token."""
        if not len(self.singles):
            return None
        a = int(self.singles[0])
        return indices(self.singles - a, self.device), indices(self.offsets[self.singles], self.device)

    @cached_property
    def single_span(self) -> tuple[int, int, int]:
        """The single call's slots [a, b), spanning every slot that feeds one token, and the columns it attends."""
        a, b = int(self.singles[0]), int(self.singles[-1]) + 1
        return a, b, int((self.filled[a:b] + self.counts[a:b]).max())

    @cached_property
    def first_token(self) -> torch.Tensor:
        """Each slot of the single call's span: its first token in the pass (0 for a slot that feeds none)."""
        a, b, _ = self.single_span
        return indices(np.where(self.counts[a:b] > 0, self.offsets[a:b], 0), self.device)

    @cached_property
    def runs(self) -> list[Run]:
        """SDPA's calls for the slots that feed more than one token (a prompt, a draft), a call's queries in blocks
        where its rule says so."""
        return [run for a, b in self._spans() for run in self._blocks(a, b)]

    def _spans(self) -> list[tuple[int, int]]:
        """The slots that feed more than one token, cut into calls by cost (merge_by_cells): across the rows between
        them where the device's rule says so, else within runs of adjacent slots."""
        multi, stops = np.flatnonzero(self.counts > 1), self.filled + self.counts
        cells = self.calls.call_cells
        if self.calls.across_gaps:
            return merge_by_cells(multi, self.counts, stops, cells)
        return [
            part for a, b in runs(multi.tolist()) for part in merge_by_cells(range(a, b), self.counts, stops, cells)
        ]

    def _blocks(self, a: int, b: int) -> list[Run]:
        """The call over slots [a, b), its queries in blocks of places [lo, hi) within their rows where the call
        would take more than the rule's block_cells (queries x keys over its slots)."""
        multi = self.counts[a:b] > 1
        width, stop = int(self.counts[a:b].max()), int((self.filled[a:b] + self.counts[a:b])[multi].max())
        block = width
        if self.calls.block_cells is not None:
            block = max(1, min(width, self.calls.block_cells // ((b - a) * stop)))
        return [self._run(a, b, lo, min(lo + block, width)) for lo in range(0, width, block)]

    def _run(self, a: int, b: int, lo: int, hi: int) -> Run:
        counts, filled = self.counts[a:b], self.filled[a:b]
        multi = counts > 1
        mine = np.flatnonzero(
            (self.row_of >= a)
            & (self.row_of < b)
            & (self.counts[self.row_of] > 1)
            & (self.step_of >= lo)
            & (self.step_of < hi)
        )
        return Run(
            first=a,
            end=b,
            width=int(np.minimum(counts[multi] - lo, hi - lo).max()),
            stop=int((filled + np.minimum(counts, hi))[multi].max()),
            tokens=indices(mine, self.device),
            slot=indices(self.row_of[mine] - a, self.device),
            step=indices(self.step_of[mine] - lo, self.device),
            fresh=b - a == 1 and int(filled[0]) == 0 and lo == 0,
            lo=lo,
        )

    @property
    def cells(self) -> tuple[int, int]:
        """Attention cells (query x key, per kv head) the pass's calls compute, and the cells its tokens need (each
        query its row's columns up to its own): the padding is the difference."""
        needed = int((self.counts * self.filled + self.counts * (self.counts + 1) // 2).sum())
        if self.kernel is not None:  # each token its own columns (a block's later columns, masked, not counted)
            return needed, needed
        computed = 0
        if self.single is not None:
            a, b, stop = self.single_span
            computed += (b - a) * stop
        for run in self.runs:
            n = run.width
            computed += n * (n + 1) // 2 if run.fresh else (run.end - run.first) * run.width * run.stop
        return computed, needed

    def _allowed(self, rows: slice, width: int, window: int | None, stop: int, lo: int = 0) -> torch.Tensor:
        """A query attends its row's columns up to its own (causal; the row's earlier tokens all come before), and
        within a window, the last `window` of them, among the call's columns [0, stop). A query beyond its row's
        tokens (a padded run's, or a slot in the single call's span that feeds nothing or more than one token)
        attends as if at the last column, never nothing: a query row that may attend to no key is where CUDA's
        kernels return NaN. Built on the device from each query's own column: only those travel. lo: the queries'
        first place in their rows (a block of a call's queries). [rows, 1, width, columns]"""
        last = max(stop, 1) - 1
        keys = torch.arange(last + 1, device=self.device)
        at = self.filled[rows, None] + lo + np.arange(width)[None, :]
        at = indices(np.minimum(at, last), self.device)[:, :, None]
        allowed = keys <= at
        if window is not None:
            allowed &= keys > at - window
        return allowed[:, None]

    def masks(self, group: int, window: int | None = None, dtype=torch.float32, softcap: bool = False) -> tuple:
        """The additive masks (0 where a query attends, -inf elsewhere, in the queries' dtype) of the single call
        and of each run (run_mask), made once per pass for each window its layers use. Where the rule does not
        keep the runs' masks for the pass, their list is None: each call makes its own."""
        key = (group, window, dtype, softcap)
        if key not in self._masks:
            single = None
            if self.single is not None:
                a, b, stop = self.single_span
                single = additive(self._allowed(slice(a, b), 1, window, stop), group, dtype)
            run_masks = None
            if self.calls.cache_run_masks:
                run_masks = [self.run_mask(run, group, window, dtype, softcap) for run in self.runs]
            self._masks[key] = (single, run_masks)
        return self._masks[key]

    def run_mask(self, run: Run, group: int, window: int | None, dtype, softcap: bool) -> torch.Tensor | None:
        """A run's additive mask, each query row repeated once per query head of a kv group (the stacking of _gqa);
        None for a fresh run where SDPA's own causal mask does (no window, no softcap: those are computed by hand,
        or bound columns)."""
        if run.fresh and window is None and not softcap:
            return None
        allowed = self._allowed(slice(run.first, run.end), run.width, window, run.stop, run.lo)
        return additive(allowed, group, dtype)


def additive(allowed: torch.Tensor, group: int, dtype) -> torch.Tensor:
    """A boolean mask as SDPA adds it (0 / -inf), each query row repeated once per query head of a kv group."""
    if group > 1:
        allowed = allowed.repeat(1, 1, group, 1)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def merge_by_cells(slots, counts: np.ndarray, stops: np.ndarray, call_cells: int) -> list[tuple[int, int]]:
    """Slots in order (each feeding counts[s] tokens, attending up to stops[s]) cut into calls [first, end): the
    next slot joins the call before it while the call padded to one width and stop over every slot from its first
    to this one (those between, which feed one token or none, count as padding) costs no more cells than the two
    calls apart and one call's fixed cost. So a merged call computes at most the cells its slots' own calls would,
    plus call_cells for each slot that joined one."""
    calls: list[list[int]] = []  # [first, end, width, stop]
    for s in slots:
        n, stop = int(counts[s]), int(stops[s])
        if calls:
            a, b, width, top = calls[-1]
            joined = (s + 1 - a) * max(width, n) * max(top, stop)
            if joined <= (b - a) * width * top + n * stop + call_cells:
                calls[-1] = [a, s + 1, max(width, n), max(top, stop)]
                continue
        calls.append([s, s + 1, n, stop])
    return [(a, b) for a, b, _, _ in calls]


def runs(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as (first, end) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for r in slots:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


def ragged_attention(
    query, key, value, layout: RaggedPass, scaling, window: int | None = None, softcap: float | None = None
) -> torch.Tensor:
    """Attention for a ragged pass: query [1, heads, tokens, dim] (the pass's tokens, flat), key and value every
    slot's columns [slots, kv heads, columns, dim]. Returns [1, tokens, heads, dim]. With the kernel, one call for
    every token; through SDPA, one call for the decoding rows and one for each run (a softcap is SDPA's alone)."""
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    group = heads // kv_heads
    flat = query[0].transpose(0, 1)  # [tokens, heads, dim]
    if layout.kernel is not None and softcap is None:
        q = flat.contiguous().view(layout.tokens, kv_heads, group, dim)
        scale = scaling if scaling is not None else dim**-0.5
        # Named for torch.profiler while it runs: the kernel is no dispatcher op, so it would go unseen.
        profiled = torch.autograd._profiler_enabled()
        with torch.profiler.record_function("offline_sumscore::pass_attention") if profiled else nullcontext():
            out = layout.kernel(q, key, value, layout.kernel_rows, window or 0, scale)
        return out.view(1, -1, heads, dim)
    single_mask, run_masks = layout.masks(group, window, query.dtype, softcap is not None)
    if layout.decoding:  # token r is slot r's: the single call's queries in order, nothing to gather or scatter
        return _single_call(flat, key, value, layout, single_mask, scaling, group, softcap)[None]
    out = torch.empty_like(flat)
    if layout.single is not None:
        decoded = _single_call(flat, key, value, layout, single_mask, scaling, group, softcap)
        out.index_copy_(0, layout.single[1], decoded)
    _attend_runs(flat, key, value, layout, scaling, group, run_masks, out, softcap, window)
    return out[None]


def _single_call(flat, key, value, layout: RaggedPass, mask, scaling, group, softcap) -> torch.Tensor:
    """The outputs of the tokens of slots that feed one token (the decoding rows), in slot order: [rows, heads, dim].
    One SDPA call spans their slots up to the longest row, masked."""
    a, b, stop = layout.single_span
    q = flat if layout.decoding else flat.index_select(0, layout.first_token)  # each slot's first token
    o = _gqa(q[:, :, None], key[a:b, :, :stop], value[a:b, :, :stop], mask, scaling, group, softcap)[:, :, 0]
    return o if layout.decoding else o.index_select(0, layout.single[0])


def _attend_runs(flat, key, value, layout: RaggedPass, scaling, group, run_masks, out, softcap=None, window=None):
    """Each run's tokens (a prompt, a draft) attend in a call of their own, written into out at their places. Where
    the pass keeps no run masks (run_masks None), each call makes its own."""
    heads = flat.shape[1]
    for k, run in enumerate(layout.runs):
        if run_masks is None:
            mask = layout.run_mask(run, group, window, flat.dtype, softcap is not None)
        else:
            mask = run_masks[k]
        at = int(layout.offsets[run.first]) + run.lo  # one slot's tokens lie together in the pass, in order
        if mask is None:  # a fresh prompt alone: SDPA's causal mask, the keys of its own width
            q = flat[at : at + run.width].transpose(0, 1)[None]  # [1, heads, width, dim]
            keys, values = key[run.first : run.end, :, : run.width], value[run.first : run.end, :, : run.width]
            o = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, is_causal=True, scale=scaling, enable_gqa=group > 1
            )
            out[at : at + run.width] = o[0].transpose(0, 1)
            continue
        keys, values = key[run.first : run.end, :, : run.stop], value[run.first : run.end, :, : run.stop]
        if run.end - run.first == 1:
            q = flat[at : at + run.width].transpose(0, 1)[None]
            out[at : at + run.width] = _gqa(q, keys, values, mask, scaling, group, softcap)[0].transpose(0, 1)
            continue
        grid = flat.new_zeros((run.end - run.first, run.width, heads, flat.shape[-1]))
        grid[run.slot, run.step] = flat.index_select(0, run.tokens)
        o = _gqa(grid.transpose(1, 2), keys, values, mask, scaling, group, softcap).transpose(1, 2)
        out.index_copy_(0, run.tokens, o[run.slot, run.step])


def _gqa(query, key, value, mask, scaling, group: int, softcap: float | None = None) -> torch.Tensor:
    """SDPA with a group's query heads stacked along the query axis ([rows, kv heads, group x queries, dim]), so
    the keys and values are never repeated per query head; the mask comes repeated so. Softcapped scores are
    computed by hand (SDPA has no softcap): tanh(score / cap) x cap, then the mask, then a float32 softmax."""
    rows, heads, queries, dim = query.shape
    if group > 1:
        query = query.reshape(rows, heads // group, group * queries, dim)
    if softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    else:
        scores = torch.matmul(query, key.transpose(-1, -2)) * (scaling if scaling is not None else dim**-0.5)
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), value)
    return out.reshape(rows, heads, queries, dim)


def grouped_query_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The attention our judges run with: ragged_attention in the engine's passes (kwargs ragged_pass), else
    scaled_dot_product_attention for grouped-query models without expanding the keys and values (a plain call of
    the model, as outlines' generate makes: transformers' SDPA path repeats every layer's keys and values once per
    query head of a group whenever a mask is given, which copies the whole cache again each step)."""
    layout, window, softcap = kwargs.get("ragged_pass"), kwargs.get("sliding_window"), kwargs.get("softcap")
    if layout is not None:
        return ragged_attention(query, key, value, layout, scaling, window, softcap), None
    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    mask = attention_mask[:, :, :, :keys] if attention_mask is not None else None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if mask is None and causal and queries > 1:  # no mask given: causal, the queries being the last positions
        mask = torch.ones((queries, keys), dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
    if mask is not None and group > 1:
        mask = mask.expand(mask.shape[0], 1, queries, keys).repeat(1, 1, group, 1)
    out = _gqa(query, key, value, mask, scaling, group, softcap)  # transformers' mask holds any window
    return out.transpose(1, 2).contiguous(), None


ATTENTION = "offline_sumscore_ragged"  # no "sdpa" in it: transformers would check SDPA support (Gemma-2 has none)


def register_attention() -> str:
    """Register grouped_query_sdpa with transformers (with SDPA's boolean masks for plain calls); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, grouped_query_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


def unsupported(config) -> str | None:
    """What in a model's attention this engine does not compute, in a few words; None when it computes all of it:
    causal attention over grouped-query heads, per-layer sliding windows, softcapped scores and logits."""
    name = getattr(config, "model_type", "this model")
    if getattr(config, "use_bidirectional_attention", False):
        return f"{name} attends both ways (use_bidirectional_attention)"
    if getattr(config, "attention_chunk_size", None):
        return f"{name} attends within chunks of {config.attention_chunk_size} tokens (attention_chunk_size)"
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", "rope") == "alibi":
        return f"{name} biases its scores by distance (ALiBi)"
    if getattr(config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model"
    return None


def check_attention(config) -> None:
    """Refuses, loudly, a model whose attention this engine would compute wrongly."""
    missing = unsupported(config)
    if missing:
        raise ValueError(
            f"{missing}, which this engine's attention does not compute; use a causal decoder judge (Llama, Qwen, "
            "Mistral, Gemma, Phi-3)"
        )
