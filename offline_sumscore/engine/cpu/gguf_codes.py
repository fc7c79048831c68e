"""A GGUF judge's quantized weights kept as the file's own block codes, on a CPU: never a float copy of the model.

Dequantized, Qwen2.5-Coder-1.5B's 1.1 GB Q4_K_M file was 6.7 GB of float32, or 2.9 GiB in bfloat16, and a decoding
step streamed all of it. Here each quantized linear weight (and the embedding table) stays a view of the file's
mapping: 4.5 bits a weight for Q4_K, 6.6 for Q6_K, so the 1.5B's weights take the file's 1.1 GB. gguf_codes.cpp
rebuilds each block of weights exactly as llama.cpp's reference dequantization does (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K), checked to the bit against gguf's own dequantization on every tensor when the file is prepared
(engine/gguf_weights.py):
- a pass of at most SMALL_ROWS[compute] rows (decoding a few rows, the vocabulary projection at the few places
  logits are read) rebuilds each output's weights into a float32 row and multiplies it against every input row: it
  streams the codes once, and computes in float32 on the exact weights. On a CPU with AVX512_BF16 a bfloat16 judge's
  passes of up to BF16_ROWS rows round each rebuilt row to bfloat16 (the weights a larger pass multiplies, to the
  bit) and multiply with vdpbf16ps, twice the products an instruction: on the 1.5B's layer 3 it took 0.68x the
  float32 row kernel's time at 8 rows and 0.67x a rebuilt weight's at 32, and drew level with a rebuilt weight at
  128 (7.3, 13.8 and 42.2 ms against 10.6, 20.6 and 44.0 ms for the layer's seven projections);
- a larger pass (a prompt's prefill, a wide decoding step with drafts: arithmetic bounds it, not memory) rebuilds
  the weight into one scratch buffer per thread, in bfloat16 where this CPU multiplies bfloat16 natively
  (bf16_linears.fast_bf16_matmul), else in float32, at most SCRATCH_ELEMENTS at a time (the vocabulary projection in
  slices), and multiplies it with torch's linear. In bfloat16 its weights are those of the earlier bfloat16
  preparation to the bit.
Where the two cross depends on what the larger pass computes in (research/gguf_small_rows.py, one decoder layer of
the 1.5B, Q4_K and Q6_K, on the 2-core AVX512_BF16 machine here). Rebuilding is cheap (a 8960 x 1536 Q4_K weight in
1.9 ms into bfloat16), and torch's bfloat16 matmul runs at about 390 GFLOP/s there, so in bfloat16 the rebuilt
weight overtook the row kernel at 24 rows (the row kernel took 1.21x as long at 32, 2.2x at 128); in float32 the row
kernel stayed ahead up to 192 rows there (0.86x), and on 2 AVX2 cores the crossover was 128-192 rows.
A kernel that cannot be built here is said once, and the loader then rebuilds the weights at load instead (see
gguf_load.load_prepared).
"""

from __future__ import annotations

import mmap
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from offline_sumscore.engine.cpu.native_build import NativeModule

# ggml type id -> (name, weights a block, bytes a block): the types the kernel rebuilds
CODED_TYPES = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
# rows in a pass up to which it multiplies the codes, by what a larger pass computes in (the measured crossovers above)
SMALL_ROWS = {torch.bfloat16: 16, torch.float32: 128}
BF16_ROWS = 128  # the same where the bfloat16 row kernel runs (AVX512_BF16): measured nearly even with a rebuilt weight
SCRATCH_ELEMENTS = 16 << 20  # weights a thread's scratch holds at most (32 MiB in bfloat16): one 8960 x 1536 MLP weight
SOURCE = Path(__file__).with_name("gguf_codes.cpp")
# Plain C++ that the compiler vectorises for the CPU it runs on: no AVX-512 needed, unlike the other kernels.
FLAGS = (
    ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"]
    if platform.machine().lower() in ("x86_64", "amd64")
    else ["-O3", "-fopenmp"]
)
NATIVE = NativeModule(
    SOURCE,
    "offline_sumscore_gguf_codes",
    ["gguf_dequantize", "gguf_codes_linear", "gguf_codes_linear_bf16", "gguf_bf16_dots"],
    "the GGUF block-code kernel",
    20,
    "A GGUF judge's weights are rebuilt into bfloat16 at each load instead (about 2.6x the file in memory).",
    flags=FLAGS,
    needs_avx512=False,
)


def small_passes(module, compute: torch.dtype) -> tuple[int, bool]:
    """Up to how many rows a pass multiplies the codes, for a judge whose large passes compute in `compute`, and
    whether it does so in bfloat16 (the bfloat16 row kernel, built where the CPU has AVX512_BF16)."""
    bf16 = compute == torch.bfloat16 and bool(module.gguf_bf16_dots())
    return (BF16_ROWS if bf16 else SMALL_ROWS[compute]), bf16


def kernel():
    """(the compiled module, None) or (None, why not in words)."""
    return NATIVE.build_or_warn(stacklevel=4)


@dataclass(frozen=True)
class CodedTensor:
    """One GGUF tensor as prepared: where its codes lie in the file and what they hold."""

    name: str  # the model's parameter name
    type: int  # ggml type id, a key of CODED_TYPES
    rows: int  # outputs (or vocabulary rows)
    columns: int  # inputs (or the embedding's width)
    offset: int  # of its first byte in the file
    permutation: tuple[int, ...] | None = None  # rows reordered as transformers reorders them (Llama's q and k)

    @property
    def row_bytes(self) -> int:
        _, weights, nbytes = CODED_TYPES[self.type]
        return self.columns // weights * nbytes

    def codes(self, mapping) -> torch.Tensor:
        """uint8 [rows, row_bytes]: a view of the file's mapping, or a reordered copy where rows are permuted."""
        view = torch.frombuffer(mapping, dtype=torch.uint8, count=self.rows * self.row_bytes, offset=self.offset)
        view = view.view(self.rows, self.row_bytes)
        if self.permutation is not None:
            view = view.index_select(0, torch.tensor(self.permutation, dtype=torch.long))
        return view


def map_file(path: Path):
    """The whole file mapped read-only in effect: private (copy on write, never written), so torch may view it."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def dequantize(module, codes: torch.Tensor, type_id: int, columns: int, dtype=torch.float32) -> torch.Tensor:
    out = torch.empty(codes.shape[0], columns, dtype=dtype)
    module.gguf_dequantize(codes, type_id, out)
    return out


class Scratch:
    """One buffer per thread and dtype into which a linear rebuilds its weight for one large pass."""

    def __init__(self, elements: int):
        self.elements = elements
        self.local = threading.local()

    def buffer(self, dtype: torch.dtype, elements: int) -> torch.Tensor:
        held = getattr(self.local, "held", None)
        if held is None:
            held = self.local.held = {}
        if dtype not in held:
            held[dtype] = torch.empty(self.elements, dtype=dtype)
        return held[dtype][:elements]


class CodedLinear(torch.nn.Module):
    """nn.Linear's forward over weights that stay GGUF block codes (see the module's docstring)."""

    def __init__(self, module, coded: CodedTensor, codes: torch.Tensor, bias, scratch: Scratch, dtype: torch.dtype):
        super().__init__()
        self.kernel, self.coded, self.scratch = module, coded, scratch
        self.register_buffer("codes", codes, persistent=False)  # counted with the weights (capacity.weight_bytes)
        self.in_features, self.out_features = coded.columns, coded.rows
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.compute = dtype  # what a large pass multiplies in: bfloat16 or float32
        # a bfloat16 judge's small passes multiply bfloat16 codes (the large pass's weights) where the CPU has the
        # instruction for it, else the float32 row kernel's exact weights
        self.small_rows, self.bf16_rows = small_passes(module, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] <= self.small_rows and self.bf16_rows:
            out = self.kernel.gguf_codes_linear_bf16(flat.to(torch.bfloat16).contiguous(), self.codes, self.coded.type)
        elif flat.shape[0] <= self.small_rows:
            out = self.kernel.gguf_codes_linear(flat.float().contiguous(), self.codes, self.coded.type)
        else:
            out = self.large(flat.to(self.compute).contiguous())
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def large(self, x: torch.Tensor) -> torch.Tensor:
        slice_rows = max(1, self.scratch.elements // self.in_features)
        if slice_rows >= self.out_features:
            weight = self.rebuilt(0, self.out_features)
            return torch.nn.functional.linear(x, weight)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        for start in range(0, self.out_features, slice_rows):
            end = min(start + slice_rows, self.out_features)
            out[:, start:end] = torch.nn.functional.linear(x, self.rebuilt(start, end))
        return out

    def rebuilt(self, start: int, end: int) -> torch.Tensor:
        weight = self.scratch.buffer(self.compute, (end - start) * self.in_features).view(end - start, -1)
        self.kernel.gguf_dequantize(self.codes[start:end], self.coded.type, weight)
        return weight

    def extra_repr(self) -> str:
        name = CODED_TYPES[self.coded.type][0]
        return f"in_features={self.in_features}, out_features={self.out_features}, {name} codes of the file"


class CodedEmbedding(torch.nn.Module):
    """nn.Embedding's forward over a table of GGUF block codes: the rows a pass needs, each rebuilt once."""

    def __init__(self, module, coded: CodedTensor, codes: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.kernel, self.coded, self.dtype = module, coded, dtype
        self.register_buffer("codes", codes, persistent=False)
        self.num_embeddings, self.embedding_dim = coded.rows, coded.columns

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids.reshape(-1), return_inverse=True)
        if unique.numel() and (int(unique[0]) < 0 or int(unique[-1]) >= self.num_embeddings):
            bad = int(unique[0]) if int(unique[0]) < 0 else int(unique[-1])
            raise IndexError(f"token id {bad} is outside the vocabulary of {self.num_embeddings}")
        rows = dequantize(self.kernel, self.codes.index_select(0, unique), self.coded.type, self.embedding_dim)
        return rows.to(self.dtype)[inverse].view(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {CODED_TYPES[self.coded.type][0]} codes of the file"
