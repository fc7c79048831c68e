// A linear layer whose weights are 4-bit block codes (block_codes.py), for passes of a few dozen rows on a CPU with
// AVX-512: each weight is rebuilt as scale x code + minimum (exact in float32: the product of a float16 scale and a
// code under 16 needs 15 bits) just before its multiply-adds, so a pass reads 0.56 bytes a weight instead of 4.
// 16 outputs lie in a vector's lanes, so every input element is broadcast once to all of them and no output needs a
// horizontal sum. Threads through torch's own OpenMP runtime. Built by `sumscore setup` (else at first use) through block_codes.py.
#include <immintrin.h>
#include <cstdint>

// Up to 8 rows of x (stride K) against one group of 16 outputs. codes: [K / 2][16] bytes, byte i of pair p holding
// output i's codes for inputs 2p (low nibble) and 2p + 1 (high); scales and mins: [K / 32][16] float16.
// Even and odd inputs go to two sums a row, so a single row has two chains of multiply-adds in flight.
template <int R>
static inline void group_rows(const float* x, int64_t K, const uint8_t* codes, const at::Half* scales,
                              const at::Half* mins, float* out, int64_t N) {
  __m512 even[R], odd[R];
  for (int r = 0; r < R; r++) even[r] = odd[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi32(0xF);
  for (int64_t b = 0; b < K / 32; b++) {
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + b * 16)));
    const __m512 low = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + b * 16)));
    const uint8_t* c = codes + b * 256;
    const float* xb = x + b * 32;
#pragma GCC unroll 4
    for (int p = 0; p < 16; p++) {
      const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + p * 16)));
      const __m512 w0 = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_and_si512(q, nibble)), low);
      const __m512 w1 = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), low);
      for (int r = 0; r < R; r++) {
        even[r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * K + 2 * p]), w0, even[r]);
        odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * K + 2 * p + 1]), w1, odd[r]);
      }
    }
  }
  for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * N, _mm512_add_ps(even[r], odd[r]));
}

// x: float32 [M, K] contiguous; codes uint8 [N / 16, K / 2, 16]; scales and mins float16 [N / 16, K / 32, 16].
// Returns float32 [M, N].
at::Tensor block_code_linear(at::Tensor x, at::Tensor codes, at::Tensor scales, at::Tensor mins) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 CPU [rows, inputs] tensor");
  const int64_t M = x.size(0), K = x.size(1), G = codes.size(0), N = G * 16;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                  codes.size(1) * 2 == K && codes.size(2) == 16 && K % 32 == 0,
              "codes must be contiguous uint8 [outputs / 16, inputs / 2, 16] for x's inputs (a multiple of 32)");
  for (const auto& t : {scales, mins})
    TORCH_CHECK(t.scalar_type() == at::kHalf && t.is_contiguous() && t.dim() == 3 && t.size(0) == G &&
                    t.size(1) * 32 == K && t.size(2) == 16,
                "scales and mins must be contiguous float16 [outputs / 16, inputs / 32, 16]");
  auto out = at::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const at::Half* S = scales.data_ptr<at::Half>();
  const at::Half* L = mins.data_ptr<at::Half>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, G, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++) {
      const uint8_t* c = C + g * (K / 2) * 16;
      const at::Half* s = S + g * (K / 32) * 16;
      const at::Half* l = L + g * (K / 32) * 16;
      for (int64_t r0 = 0; r0 < M; r0 += 8) {  // the group's codes stay in L1 for the next 8 rows
        const float* xr = X + r0 * K;
        float* o = O + r0 * N + g * 16;
        switch (std::min<int64_t>(8, M - r0)) {
          case 1: group_rows<1>(xr, K, c, s, l, o, N); break;
          case 2: group_rows<2>(xr, K, c, s, l, o, N); break;
          case 3: group_rows<3>(xr, K, c, s, l, o, N); break;
          case 4: group_rows<4>(xr, K, c, s, l, o, N); break;
          case 5: group_rows<5>(xr, K, c, s, l, o, N); break;
          case 6: group_rows<6>(xr, K, c, s, l, o, N); break;
          case 7: group_rows<7>(xr, K, c, s, l, o, N); break;
          default: group_rows<8>(xr, K, c, s, l, o, N); break;
        }
      }
    }
  });
  return out;
}
