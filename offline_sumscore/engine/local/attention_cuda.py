"""A GPU's attention: how a ragged pass's SDPA calls are cut where a call is a kernel launch and memory is bounded.
The calls themselves are attention.py's, shared with a CPU that has no attention kernel; a CPU with one attends in
engine/cpu/attention_kernel.py.

What differs from a CPU (CPU_CALLS), and why:
- A call costs a launch (and its mask's few kernels), about what a few hundred thousand attention cells do, so
  slots that feed more than one token join one call across the decoding rows between them while the padding that
  adds costs less than a call (call_cells). The padding a merged call computes is bounded by its merges: never a
  call padded to the widest feed over unrelated rows, which the engine made before (past 8 runs, one call spanning
  the first such slot to the last, padded to the widest feed: 512x the cells needed and an 8.1 GiB mask at 400
  rows beside one 800-token prompt, measured on the CPU with the engine's own layout).
- No run's mask is held for a whole pass; each call makes its own, and a call's queries go in blocks where its
  mask or its softcapped scores would pass block_cells cells (queries x keys over its slots): a 16,384-token chunk
  of a long document after its first chunk is blocks of a few hundred queries, not one mask of gigabytes.

Not used, and why: FlexAttention and varlen SDPA read keys laid out by sequence, not the engine's slots ([slots, kv
heads, columns, dim]); they would need the paged or packed cache this engine does not have, and nothing here has run
on a GPU yet to say what they would gain (docs/performance.md).
"""

from __future__ import annotations

from offline_sumscore.engine.local.attention import CPU_CALLS, CallRule

# A call's fixed cost in attention cells on a GPU: a launch of some 10-20 us, at the hundreds of TFLOP/s an H200's
# attention reaches, is worth 10^5 to 10^6 cells of a 7-8B judge (an estimate, not a measurement: no GPU has run
# it). The lower end: merging only where it is clearly cheaper.
GPU_CALL_CELLS = 1 << 18
# Queries x keys a call attends at most before its queries go in blocks: a bfloat16 mask of a group of 8 query heads
# is then at most 128 MiB, Gemma-2-9B's float32 softcapped scores (16 heads) 512 MiB.
GPU_BLOCK_CELLS = 1 << 23

GPU_CALLS = CallRule(
    "gpu", call_cells=GPU_CALL_CELLS, across_gaps=True, block_cells=GPU_BLOCK_CELLS, cache_run_masks=False
)


def call_rule(bounded: bool) -> CallRule:
    """The calls of a device of bounded memory (a GPU, or one emulated on the CPU), else a CPU's."""
    return GPU_CALLS if bounded else CPU_CALLS
