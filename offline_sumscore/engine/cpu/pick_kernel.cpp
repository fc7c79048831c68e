// The greedy pick under a grammar's packed bitmask on a CPU, in one pass over each read point's logits: whether the
// row holds a NaN, and the first allowed token of the largest logit. torch takes six passes over [reads, vocab] for
// it (isnan, an unpack of the bitmask to one int32 per token, a compare, its inverse, masked_fill, argmax). Float32,
// AVX-512, threads through torch's own OpenMP runtime. Built by `sumscore setup` (else at first use) through pick_kernel.py.
#include <immintrin.h>
#include <cstdint>
#include <limits>

// Per read point r: logits row r (its first `vocab` values), its mask row bitmask[mask_rows[r]] (bit t of word t / 32
// set: token t allowed). Returns int64 [reads]: the pick, -1 where the logits hold a NaN anywhere in the row (a
// poisoned pass, never read as a verdict), and 0 where the mask allows nothing (as torch's argmax over a row of -inf).
at::Tensor masked_argmax(at::Tensor logits, at::Tensor bitmask, at::Tensor mask_rows, int64_t vocab) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
                  logits.stride(1) == 1,
              "logits must be float32 CPU [reads, >= vocab] with contiguous rows");
  TORCH_CHECK(bitmask.device().is_cpu() && bitmask.scalar_type() == at::kInt && bitmask.dim() == 2 &&
                  bitmask.is_contiguous(),
              "bitmask must be a contiguous int32 CPU [rows, words] tensor");
  TORCH_CHECK(mask_rows.scalar_type() == at::kLong && mask_rows.numel() == logits.size(0),
              "mask_rows must hold one int64 row index per read point");
  const int64_t reads = logits.size(0), words = bitmask.size(1);
  TORCH_CHECK(vocab <= logits.size(1) && (vocab + 31) / 32 <= words, "vocab exceeds the logits or the bitmask");
  auto picks = at::empty({reads}, at::kLong);
  const float* L = logits.data_ptr<float>();
  const int64_t stride = logits.stride(0);
  const uint32_t* B = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  const int64_t* rows = mask_rows.data_ptr<int64_t>();
  int64_t* out = picks.data_ptr<int64_t>();
  for (int64_t r = 0; r < reads; r++)
    TORCH_CHECK(rows[r] >= 0 && rows[r] < bitmask.size(0), "mask row ", rows[r], " out of range");
  at::parallel_for(0, reads, 4, [&](int64_t r0, int64_t r1) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t r = r0; r < r1; r++) {
      const float* x = L + r * stride;
      const uint32_t* bits = B + rows[r] * words;
      __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      __m512i where = _mm512_set1_epi32(-1);  // each lane's first index of its largest allowed value; -1: none yet
      __mmask16 nan = 0;
      for (int64_t k = 0; k < vocab; k += 16) {
        const int64_t left = vocab - k;
        const __mmask16 in = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, x + k);
        nan |= _mm512_mask_cmp_ps_mask(in, v, v, _CMP_UNORD_Q);
        const __mmask16 allowed = (__mmask16)(bits[k >> 5] >> (k & 31)) & in;
        const __m512i index = _mm512_add_epi32(_mm512_set1_epi32((int32_t)k), lane);
        // strictly larger (a tie keeps the earlier index), or the lane's first allowed value (-inf included)
        const __mmask16 take = allowed & (_mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) |
                                          _mm512_cmpeq_epi32_mask(where, _mm512_set1_epi32(-1)));
        best = _mm512_mask_mov_ps(best, take, v);
        where = _mm512_mask_mov_epi32(where, take, index);
      }
      if (nan) {
        out[r] = -1;
        continue;
      }
      alignas(64) float value[16];
      alignas(64) int32_t index[16];
      _mm512_store_ps(value, best);
      _mm512_store_epi32(index, where);
      int32_t pick = -1;
      float top = 0.0f;
      for (int i = 0; i < 16; i++) {  // the largest value; among equal ones the smallest index (the first)
        if (index[i] < 0) continue;
        if (pick < 0 || value[i] > top || (value[i] == top && index[i] < pick)) {
          pick = index[i];
          top = value[i];
        }
      }
      out[r] = pick < 0 ? 0 : pick;
    }
  });
  return picks;
}
