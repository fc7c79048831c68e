"""A float32 judge's linear layers on the CPU, on weights prepacked once for oneDNN (what vLLM's CPU build does).

torch's own linear multiplies the weight as it lies on every call; oneDNN's matmul on a weight reordered once into
its blocked layout ran the embedded judge's projections 2 to 3x faster at 8 to 256 rows a call on the 2-core machine
here (576x576, 576x1536 and 1536x576: 725 us against 296 us at 61 rows; at 1 row, 23 us against 27 us). Results
agree with torch's to float32 rounding (largest difference 2e-4 on outputs of size ~25). The packed copy replaces
the dense weight, which nothing reads again: the layer's weight becomes None (its in_ and out_features stay), so
the judge does not hold its linears twice (405 MiB of the embedded judge's 513), and code that would read the old
weight fails loudly (a meta tensor would not: torch's linear of a CPU input and a meta weight returns garbage). A
weight another module shares stays as it is: a tied head's is the embedding table that looks up the input tokens.
transformers loads safetensors weights as views of one mapping of the file, which stays mapped, and resident, while
any tensor views it; so the weights that stay (embeddings, norms) are copied out of it, and the mapping goes. The
embedded judge's process then holds 1,003 MiB after loading instead of 1,407.
OFFLINE_SUMSCORE_CPU_GEMM=torch keeps torch's linear (an A/B switch for the benchmarks).

A weight that is exactly 4-bit block codes (the embedded judge's, from its GGUF) is also kept as those codes, 66 MB
beside the packed 425 MB, and a pass of a few dozen rows or fewer multiplies them instead (block_codes.py): such a
pass is bound by streaming the weights, not by arithmetic.

oneDNN builds a primitive for each input shape it meets and caches it twice (its own primitive cache and ideep's
above it, 1,024 entries each by default), about 0.5 MB a shape. The engine's passes carry every token count from 1 to
the budget, so on a long run both caches fill: measured, the C heap in use grew by 350 MiB over the soak's first 350
generating-design rows before levelling off, and 800 row counts through two packed layers grew it by 382 MiB. Building
a primitive costs less than looking it up is worth here (the same 800 calls ran in 2.15 s with 16 entries against 2.46
s with 1,024), so both caches are capped at PRIMITIVE_CACHE entries, unless the user's environment sets them.
"""

from __future__ import annotations

import os

from offline_sumscore.engine.cpu import block_codes

ROWS_HINT = 64  # the row count oneDNN lays the packed weight out for; any row count runs on it
PRIMITIVE_CACHE = 64  # shapes kept by oneDNN's primitive cache and by ideep's (each a few passes' worth)
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


def pack_linears(model) -> str:
    """Every float32 CPU nn.Linear of model on a prepacked weight. Returns what was done, for judge.decisions."""
    import torch

    if os.environ.get("OFFLINE_SUMSCORE_CPU_GEMM", "onednn") == "torch":
        return "torch's linear (OFFLINE_SUMSCORE_CPU_GEMM=torch)"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "torch's linear (this torch build has no oneDNN)"
    # Read once, when each library first builds a primitive: in a process whose oneDNN already ran, they stay as set.
    for name in CACHE_VARIABLES:
        os.environ.setdefault(name, str(PRIMITIVE_CACHE))
    linears = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and m.weight is not None  # None: packed already, its dense weight released
        and m.weight.dtype == torch.float32
        and m.weight.device.type == "cpu"
    ]
    holders: dict[int, int] = {}  # where a weight starts -> how many parameters hold it (tied ones: more than one)
    for _, param in model.named_parameters(remove_duplicate=False):
        holders[param.data_ptr()] = holders.get(param.data_ptr(), 0) + 1
    coded_linear, not_coded = block_codes.kernel()
    released, packed, coded = 0, [], []
    for module in linears:
        weight = module.weight
        packed.append(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT))
        coded.append(None if coded_linear is None else block_codes.find_block_codes(weight))
        if holders[weight.data_ptr()] == 1:
            released += weight.numel() * weight.element_size()
            module.register_parameter("weight", None)
    # Before anything holds a view of them (the packed forwards their biases, layer_ops its norms' weights).
    with torch.no_grad():
        for param in model.parameters():
            if param.device.type == "cpu":
                param.data = param.data.clone()
    for module, weight, codes in zip(linears, packed, coded):
        bias = None if module.bias is None else module.bias.detach()
        module.forward = _packed(weight, bias) if codes is None else _coded(weight, bias, coded_linear, codes)
    found = [c for c in coded if c is not None]
    if found:
        small = (
            f"; passes of up to {block_codes.SMALL_ROWS} rows on 4-bit block codes for {len(found)} of them, the "
            f"same weights to the bit ({sum(c.nbytes for c in found) / 2**20:,.0f} MiB)"
        )
    else:
        small = f"; 4-bit block codes {not_coded or 'not found: no weight is exactly such a code'}"
    return (
        f"oneDNN on prepacked weights ({len(linears)} linear layers; 2-3x torch's linear at 8-256 rows here; "
        f"their dense copies released, {released / 2**20:,.0f} MiB){small}"
    )


def _packed(weight, bias):
    import torch

    def forward(x):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    return forward


def _coded(weight, bias, coded_linear, codes):
    packed = _packed(weight, bias)  # the larger passes
    rows_at_most = block_codes.SMALL_ROWS * codes.codes.shape[1] * 2  # input elements of SMALL_ROWS rows

    def forward(x):
        if x.numel() <= rows_at_most:
            return block_codes.linear(coded_linear, x, codes, bias)
        return packed(x)

    return forward
