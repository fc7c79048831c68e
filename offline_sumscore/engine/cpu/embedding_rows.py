"""A prepared judge's embedding table read from its file a row at a time, on a CPU: never mapped into memory.

An embedding is a lookup: a pass reads one row per token. Mapped from the prepared safetensors, as transformers maps
every weight, the table became resident as a run touched it (a fault maps the neighbouring pages the page cache
holds, and a run touches rows all over the vocabulary): on the demo's rows with Qwen2.5-Coder-1.5B, madvise(RANDOM)
or not, all but a few MiB of the 446 MiB table, against 3.1 GB for the whole judge. Read with pread, a row is one
system call of 3 KiB (a pass of 2,048 tokens reads at most 2,048 rows, about 3 ms) and the table holds no memory. The
rows are the file's bytes, so a pass computes exactly what it computed on the mapped table: the load checks the first
and last rows against the mapping before it lets the mapping go.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


class EmbeddingRowsFromFile(torch.nn.Module):
    """nn.Embedding's forward over a table that stays on disk: the rows a pass needs, each read once by pread."""

    def __init__(self, path: Path, offset: int, rows: int, dim: int, dtype: torch.dtype):
        super().__init__()
        self.path, self.offset, self.rows, self.dim, self.dtype = str(path), offset, rows, dim, dtype
        self.row_bytes = dim * torch.empty((), dtype=dtype).element_size()
        self.fd = os.open(self.path, os.O_RDONLY)

    def read_rows(self, ids: list[int]) -> torch.Tensor:
        data = bytearray()
        for i in ids:
            row = os.pread(self.fd, self.row_bytes, self.offset + i * self.row_bytes)
            if len(row) != self.row_bytes:
                raise OSError(f"{self.path}: row {i} of the embedding table is cut off (the file shrank?)")
            data += row
        return torch.frombuffer(data, dtype=self.dtype).view(len(ids), self.dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids.reshape(-1), return_inverse=True)
        ids = unique.tolist()
        if ids and (ids[0] < 0 or ids[-1] >= self.rows):
            raise IndexError(f"token id {ids[0] if ids[0] < 0 else ids[-1]} is outside the vocabulary of {self.rows}")
        return self.read_rows(ids)[inverse].view(*input_ids.shape, self.dim)

    def extra_repr(self) -> str:
        return f"{self.rows}, {self.dim}, read from {self.path}"

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def embedding_from_file(model, folder: Path) -> str:
    """Replace model's input embedding by one read from the prepared folder's safetensors. Returns what was done, or
    why not, for judge.decisions."""
    folder = Path(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    names = [k for k in index["weight_map"] if k.endswith("embed_tokens.weight")]
    if len(names) != 1:
        return "mapped as every weight (no single embed_tokens.weight in the prepared folder)"
    name = names[0]
    shard = folder / index["weight_map"][name]
    with open(shard, "rb") as f:
        header_bytes = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(header_bytes))[name]
    mapped = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None and head.weight.data_ptr() == mapped.data_ptr():
        return "mapped as every weight (tied to the vocabulary projection, which reads the whole table at every step)"
    rows, dim = meta["shape"]
    if DTYPES.get(meta["dtype"]) != mapped.dtype or tuple(mapped.shape) != (rows, dim):
        return f"mapped as every weight (the file's {meta['dtype']} {meta['shape']} is not the loaded table's)"
    table = EmbeddingRowsFromFile(shard, 8 + header_bytes + meta["data_offsets"][0], rows, dim, mapped.dtype)
    if not torch.equal(table.read_rows([0, rows - 1]), mapped[[0, rows - 1]]):
        raise OSError(f"{shard}: the embedding rows read from the file differ from the loaded table's")
    model.set_input_embeddings(table)
    return (
        f"the {rows:,} x {dim} embedding table read a row at a time from {shard.name} (pread), never mapped: "
        f"{rows * table.row_bytes / 2**20:,.0f} MiB not held in memory"
    )
