"""A varlen decode attention kernel of our own (C++, built at run time) against the engine's SDPA call, in turns.

    python research/varlen_decode_probe.py

research/bulk_profile.py found the call over the decoding rows reading 1.1 GB of keys and values a pass at bulk,
40% of its cells padding: SDPA over a span of slots attends every slot up to the longest row. A kernel that walks
each row's own columns only ([0, length)), the kv group's query heads together (each key read once for all of
them), reads what the rows need and nothing else. This builds one with torch.utils.cpp_extension.load_inline
(g++, -O3 -march=native; about a minute the first time, cached after) and times it against the engine's call
(SDPA with an additive mask over the padded span) on slots laid out as KVSlots lays them ([slots, kv heads,
capacity, dim], rows left-aligned), lengths drawn as the bulk workload's. Outputs checked against each other.
Writes results/varlen_decode_probe.md (--name).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from research.attention_kernels import DIM, HEADS, KV_HEADS, in_turns  # noqa: E402
from research.tables import publish  # noqa: E402

F = torch.nn.functional

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// q [rows, kv, group, dim] contiguous; k, v [slots, kv, capacity, dim] with unit stride in dim; row r attends
// slot r's columns [0, lengths[r]). Returns [rows, kv, group, dim].
torch::Tensor varlen_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor lengths, double scale) {
  const int64_t rows = q.size(0), kv = q.size(1), group = q.size(2), dim = q.size(3);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  at::parallel_for(0, rows * kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / kv, h = i % kv, n = lp[r];
      const float* qi = qp + i * group * dim;
      const float* kb = kp + r * ks0 + h * ks1;
      const float* vb = vp + r * vs0 + h * vs1;
      scores.assign(group * n, 0.f);
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = kb + j * ks2;
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = qi + g * dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < dim; ++d) s += qg[d] * kj[d];
          scores[g * n + j] = s * (float)scale;
        }
      }
      acc.assign(group * dim, 0.f);
      std::vector<float> total(group, 0.f);
      for (int64_t g = 0; g < group; ++g) {
        float top = -INFINITY;
        for (int64_t j = 0; j < n; ++j) top = std::max(top, scores[g * n + j]);
        for (int64_t j = 0; j < n; ++j) {
          float e = std::exp(scores[g * n + j] - top);
          scores[g * n + j] = e;
          total[g] += e;
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        const float* vj = vb + j * vs2;
        for (int64_t g = 0; g < group; ++g) {
          const float w = scores[g * n + j];
          float* a = acc.data() + g * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) a[d] += w * vj[d];
        }
      }
      float* oi = op + i * group * dim;
      for (int64_t g = 0; g < group; ++g)
        for (int64_t d = 0; d < dim; ++d) oi[g * dim + d] = acc[g * dim + d] / total[g];
    }
  });
  return out;
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    started = time.perf_counter()
    module = load_inline(
        name="offline_sumscore_varlen_decode_probe",
        cpp_sources=SOURCE,
        functions=["varlen_decode"],
        extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
        verbose=False,
    )
    return module, time.perf_counter() - started


def case(module, rows: int, low: int, high: int, capacity: int = 1024):
    group = HEADS // KV_HEADS
    lengths = torch.randint(low, high + 1, (rows,))
    stop = int(lengths.max())
    keys, values = torch.randn(rows, KV_HEADS, capacity, DIM), torch.randn(rows, KV_HEADS, capacity, DIM)
    query = torch.randn(rows, KV_HEADS, group, DIM)
    allowed = torch.arange(stop)[None, :] < lengths[:, None]
    additive = torch.zeros(rows, 1, group, stop).masked_fill_(~allowed[:, None, None], float("-inf"))
    k, v = keys[:, :, :stop], values[:, :, :stop]

    def ours():
        return F.scaled_dot_product_attention(query, k, v, attn_mask=additive)

    def varlen():
        return module.varlen_decode(query, keys, values, lengths, DIM**-0.5)

    diff = (ours() - varlen()).abs().max().item()
    a, b = in_turns(ours, varlen, repeats=15)
    return int(lengths.sum()), rows * stop, a, b, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="varlen_decode_probe")
    args = ap.parse_args()
    torch.manual_seed(0)
    module, build_s = build()
    lines = [
        f"# A varlen decode attention kernel against the engine's SDPA call (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        f"Command: `python research/varlen_decode_probe.py`. Built in {build_s:.1f} s (load_inline; cached after the "
        "first build). One layer's call over the decoding rows, slots of 1,024 columns as KVSlots holds them; median "
        "ms of 15 alternating calls. Cells: query token x key columns per kv head.",
        "",
        "| rows | lengths | cells needed | cells SDPA computes | SDPA ms | varlen ms | SDPA / varlen | largest "
        "difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rows, low, high in ((64, 150, 470), (64, 400, 470), (32, 300, 460), (16, 100, 900)):
        needed, padded, a, b, diff = case(module, rows, low, high)
        lines.append(f"| {rows} | {low}-{high} | {needed} | {padded} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.1e} |")
        print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
