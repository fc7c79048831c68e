"""The running batch's KV cache and attention mask, row by row: select, merge, compact, trim.

Each layer of a transformers DynamicCache holds keys and values of shape [rows, heads, columns, head_dim]; the
mask is [rows, columns], 1 where a row attends. Rows are aligned across both: row i of the mask is row i of every
layer. Columns are shared by all rows, so a row that joins later is left-padded with masked columns.
"""
from __future__ import annotations

def _layers(cache):
    return [layer for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]


def select_rows(cache, index) -> None:
    for layer in _layers(cache):
        layer.keys, layer.values = layer.keys[index], layer.values[index]


def merge_rows(cache, mask, active, new_cache, new_mask, new_rows):
    """Join newly prefilled rows to the running batch: left-pad the shorter cache with masked columns."""
    import torch

    if cache is None or not active:
        return new_cache, new_mask, new_rows
    a, b = mask.shape[1], new_mask.shape[1]
    width = max(a, b)

    def pad(t, cols):  # left-pad a [rows, heads, cols, dim] tensor
        if cols == width:
            return t
        z = t.new_zeros(t.shape[0], t.shape[1], width - cols, t.shape[3])
        return torch.cat([z, t], dim=2)

    for old, new in zip(_layers(cache), _layers(new_cache)):
        old.keys = torch.cat([pad(old.keys, a), pad(new.keys, b)], dim=0)
        old.values = torch.cat([pad(old.values, a), pad(new.values, b)], dim=0)
    left = lambda m, cols: torch.cat([m.new_zeros(m.shape[0], width - cols), m], dim=1) if cols < width else m
    return cache, torch.cat([left(mask, a), left(new_mask, b)], dim=0), active + new_rows


def compact_rows(cache, mask, active):
    """Drop the finished rows' slots from the batch (one copy of the KV cache)."""
    import torch

    keep = [i for i, r in enumerate(active) if not r.done]
    if not keep:
        return None, None, []
    if len(keep) < len(active):
        index = torch.tensor(keep, device=mask.device, dtype=torch.long)
        select_rows(cache, index)
        mask, active = mask[index], [active[i] for i in keep]
    return trim_columns(cache, mask, active)


def trim_columns(cache, mask, active):
    """Drop leading columns that no row attends to (left padding of rows that have left)."""
    if mask is None or not active:
        return cache, mask, active
    used = mask.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else mask.shape[1]
    if first > 0:
        for layer in _layers(cache):
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        mask = mask[:, first:]
    return cache, mask, active
