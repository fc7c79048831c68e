"""The decoder's projections at the few rows of a decoding pass: oneDNN on prepacked weights (the engine's), a kernel of
our own over the dense weights (C++, built at run time), and the rate the machine reads the same weights at.

    python research/small_rows_gemm.py

A pass that decodes a handful of rows computes little and reads every weight once: the embedded judge's 210 decoder
projections hold 425 MB in float32, so such a pass is bound by how fast the weights stream. This times, at the
judge's shapes (30 layers of q, k, v, o, gate, up and down; random weights), in alternating calls: the engine's
oneDNN linears on weights prepacked as `engine/cpu/cpu_gemm.py` packs them, a plain AVX-512 kernel over the dense
weights (4 outputs a block against up to 6 rows, the next block prefetched; both threads), and a sum over each
weight (the same 210 reads with no arithmetic: what a projection bound by memory could reach). Then the vocabulary
projection (49,152 x 576) at the rows a step reads. Outputs checked against torch's. Writes
results/small_rows_gemm.md (--name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from research.attention_kernels import in_turns  # noqa: E402
from research.tables import publish  # noqa: E402

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (out, in)
VOCAB = (49152, 576)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// y[M, N] = x[M, K] . w[N, K]^T for K a multiple of 16: 4 outputs a block, MB rows at a time, the block after
// next prefetched as this one streams.
template <int MB>
static void block(const float* x, int64_t K, const float* w, int64_t n0, int64_t nb, float* y, int64_t N,
                  int64_t m0) {
  __m512 acc[4][MB];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < MB; j++) acc[i][j] = _mm512_setzero_ps();
  const float* w0 = w + n0 * K;
  for (int64_t k = 0; k < K; k += 16) {
    __m512 wv[4];
    for (int i = 0; i < 4; i++) {
      wv[i] = _mm512_loadu_ps(w0 + (i < nb ? i : 0) * K + k);
      _mm_prefetch((const char*)(w0 + (i + 8) * K + k), _MM_HINT_T0);
    }
    for (int j = 0; j < MB; j++) {
      const __m512 xv = _mm512_loadu_ps(x + (m0 + j) * K + k);
      for (int i = 0; i < 4; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < nb; i++)
    for (int j = 0; j < MB; j++) y[(m0 + j) * N + n0 + i] = _mm512_reduce_add_ps(acc[i][j]);
}

torch::Tensor small_rows(torch::Tensor x, torch::Tensor w) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % 16 == 0 && x.is_contiguous() && w.is_contiguous(), "contiguous, K a multiple of 16");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b++) {
      const int64_t n0 = b * 4, nb = std::min<int64_t>(4, N - n0);
      int64_t m0 = 0;
      for (; m0 + 6 <= M; m0 += 6) block<6>(xp, K, wp, n0, nb, yp, N, m0);
      switch (M - m0) {
        case 5: block<5>(xp, K, wp, n0, nb, yp, N, m0); break;
        case 4: block<4>(xp, K, wp, n0, nb, yp, N, m0); break;
        case 3: block<3>(xp, K, wp, n0, nb, yp, N, m0); break;
        case 2: block<2>(xp, K, wp, n0, nb, yp, N, m0); break;
        case 1: block<1>(xp, K, wp, n0, nb, yp, N, m0); break;
      }
    }
  });
  return y;
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    started = time.perf_counter()
    module = load_inline(
        name="offline_sumscore_small_rows_probe",
        cpp_sources=SOURCE,
        functions=["small_rows"],
        extra_cflags=["-O3", "-march=native", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
    return module, time.perf_counter() - started


def projections(shapes):
    """Dense weights, oneDNN's prepacked copies (the engine's row hint), and a timing of each way over all of them."""
    from offline_sumscore.engine.cpu.cpu_gemm import ROWS_HINT

    dense = [torch.randn(out, inp) for out, inp in shapes]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT) for w in dense]
    return dense, packed


def onednn(x, packed):
    """The engine's linear on a prepacked weight (cpu_gemm._packed), without a bias."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="small_rows_gemm")
    args = ap.parse_args()
    torch.manual_seed(0)
    module, build_s = build()
    dense, packed = projections(LAYER * 30)
    megabytes = sum(w.numel() for w in dense) * 4 / 1e6
    lines = [
        f"# The decoder's projections at a decoding pass's few rows (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)",
        "",
        f"Command: `python research/small_rows_gemm.py`. Built in {build_s:.1f} s (load_inline; cached after the first "
        f"build). The embedded judge's 210 decoder projections, random float32 weights ({megabytes:.0f} MB); median ms "
        "of alternating calls over all of them. GB/s: the weights' bytes over the time.",
        "",
    ]
    with torch.inference_mode():
        sums = median_ms(lambda: [w.sum() for w in dense], 9)
        lines += [
            f"Reading the weights with no arithmetic (a sum over each, 210 calls): {sums:.1f} ms, "
            f"{megabytes / sums:.1f} GB/s.",
            "",
            "| rows | oneDNN prepacked ms | GB/s | our kernel ms | GB/s | oneDNN / ours | largest difference |",
            "|---|---|---|---|---|---|---|",
        ]
        for rows in (1, 2, 4, 6, 8, 16, 32):
            x = {inp: torch.randn(rows, inp) for _, inp in LAYER}
            diff = max(
                (module.small_rows(x[w.shape[1]], w) - x[w.shape[1]] @ w.T).abs().max().item() for w in dense[:7]
            )
            a, b = in_turns(
                lambda x=x: [onednn(x[w.shape[1]], p) for w, p in zip(dense, packed)],
                lambda x=x: [module.small_rows(x[w.shape[1]], w) for w in dense],
                9,
            )
            lines.append(
                f"| {rows} | {a:.1f} | {megabytes / a:.1f} | {b:.1f} | {megabytes / b:.1f} | {a / b:.2f} | {diff:.1e} |"
            )
            print(lines[-1], flush=True)
        head, head_packed = projections([VOCAB])
        head_mb = head[0].numel() * 4 / 1e6
        lines += [
            "",
            f"The vocabulary projection ({VOCAB[0]:,} x {VOCAB[1]}, {head_mb:.0f} MB) at a step's read points:",
            "",
            "| read points | oneDNN prepacked ms | our kernel ms | oneDNN / ours |",
            "|---|---|---|---|",
        ]
        for rows in (1, 6, 20, 40):
            x = torch.randn(rows, VOCAB[1])
            a, b = in_turns(lambda x=x: onednn(x, head_packed[0]), lambda x=x: module.small_rows(x, head[0]), 15)
            lines.append(f"| {rows} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
            print(lines[-1], flush=True)
    publish(args.name, lines)


if __name__ == "__main__":
    main()
