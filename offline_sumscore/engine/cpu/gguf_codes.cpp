// A GGUF file's quantized weights used as they lie in the file (gguf_codes.py): every block rebuilt into float32
// exactly as llama.cpp's reference dequantization (ggml-quants.c, dequantize_row_*) rebuilds it, then either written
// out (gguf_dequantize: an embedding's rows, a large pass's scratch weight) or multiplied at once against a few rows
// of activations (gguf_codes_linear). Every product of a scale and a code below is exact in float32 (a float16 scale
// times a 6-bit sub-scale times a code of at most 6 bits needs at most 24 bits), so the one rounding left is the
// minimum's subtraction, as in the reference: the weights are the reference's to the bit however the compiler fuses.
// Plain loops the compiler vectorises, but for the dot products (AVX2, and AVX-512 tiles of 4 weight rows by 4 input
// rows where the CPU has it); threads through torch's own OpenMP runtime.
#include <cstdint>
#include <algorithm>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cstring>
#include <vector>

namespace {

// ggml's type ids, block sizes (weights) and block bytes
enum : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

inline float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// The 6-bit scale and minimum of sub-block j of a K-quant's 12 packed bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void block_q4_0(const uint8_t* b, float* y) {  // d f16, qs[16]
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const uint8_t* b, float* y) {  // d f16, m f16, qs[16]
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; j++) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The fifth bit of each of 32 weights (a little-endian word qh): weight j's at bit j, weight j + 16's at bit j + 16.
inline uint32_t high_bits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  return qh;
}

void block_q5_0(const uint8_t* b, float* y) {  // d f16, qh[4], qs[16]
  const float d = half(b);
  const uint32_t qh = high_bits(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; j++) {
    const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

void block_q5_1(const uint8_t* b, float* y) {  // d f16, m f16, qh[4], qs[16]
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = high_bits(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; j++) {
    const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
    y[j] = static_cast<float>((qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}

void block_q8_0(const uint8_t* b, float* y) {  // d f16, qs[32] int8
  const float d = half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; j++) y[j] = static_cast<float>(qs[j]) * d;
}

void block_q4_k(const uint8_t* b, float* y) {  // d f16, dmin f16, scales[12], qs[128]
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    int sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; l++) y[j + l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

void block_q5_k(const uint8_t* b, float* y) {  // d f16, dmin f16, scales[12], qh[32], qs[128]
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    int sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; l++) y[j + l] = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
  }
}

void block_q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], scales[16] int8, d f16
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  // The reference computes d * sc[is] * q left to right, so each run of 16 weights shares the product d * sc[is];
  // hoisting it leaves loops of 16 the compiler vectorises.
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int is = 0; is < 2; is++) {
      const float s1 = d * sc[is], s2 = d * sc[is + 2], s3 = d * sc[is + 4], s4 = d * sc[is + 6];
      for (int l = is * 16; l < is * 16 + 16; l++) {
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = s1 * static_cast<float>(q1);
        y[l + 32] = s2 * static_cast<float>(q2);
        y[l + 64] = s3 * static_cast<float>(q3);
        y[l + 96] = s4 * static_cast<float>(q4);
      }
    }
  }
}

struct Format {
  int weights;  // a block's
  int bytes;
  void (*rebuild)(const uint8_t*, float*);
};

Format format_of(int64_t type) {
  switch (type) {
    case Q4_0: return {32, 18, block_q4_0};
    case Q4_1: return {32, 20, block_q4_1};
    case Q5_0: return {32, 22, block_q5_0};
    case Q5_1: return {32, 24, block_q5_1};
    case Q8_0: return {32, 34, block_q8_0};
    case Q4_K: return {256, 144, block_q4_k};
    case Q5_K: return {256, 176, block_q5_k};
    case Q6_K: return {256, 210, block_q6_k};
  }
  TORCH_CHECK(false, "GGUF tensor type ", type, " is not one this kernel rebuilds");
}

inline void rebuild_row(const Format& f, const uint8_t* row, int64_t K, float* y) {
  for (int64_t b = 0; b < K / f.weights; b++) f.rebuild(row + b * f.bytes, y + b * f.weights);
}

// the sums of w_r[i] * x[i] over K (a multiple of 32) for R rows of weights at once: x is read once for all R, and
// 2R vector sums keep enough multiply-adds in flight to hide their latency
template <int R>
inline void dots(const float* w, const float* x, int64_t K, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < K; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    for (int r = 0; r < R; r++) {
      acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + i), x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + i + 8), x1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; r++) {
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(acc[r][0], acc[r][1]));
    float s = 0;
    for (int j = 0; j < 8; j++) s += lanes[j];
    out[r] = s;
  }
#else
  float acc[R][16] = {};
  for (int64_t i = 0; i < K; i += 16)
    for (int r = 0; r < R; r++)
      for (int j = 0; j < 16; j++) acc[r][j] += w[r * K + i + j] * x[i + j];
  for (int r = 0; r < R; r++) {
    float s = 0;
    for (int j = 0; j < 16; j++) s += acc[r][j];
    out[r] = s;
  }
#endif
}

#if defined(__AVX512F__)
// R rows of weights against B rows of x at once, 16 lanes a step: each step loads B + R vectors for R x B
// multiply-adds, where dots<R> loads 1 + R for R, so a pass of a few rows stops being bound by its loads.
// out[b * N + r] = sum_i w_r[i] * x_b[i]; K a multiple of 32.
template <int R, int B>
inline void tile(const float* w, const float* x, int64_t K, float* out, int64_t N) {
  __m512 acc[R][B];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K; i += 16) {
    __m512 xs[B];
    for (int b = 0; b < B; b++) xs[b] = _mm512_loadu_ps(x + b * K + i);
    for (int r = 0; r < R; r++) {
      const __m512 wr = _mm512_loadu_ps(w + r * K + i);
      for (int b = 0; b < B; b++) acc[r][b] = _mm512_fmadd_ps(wr, xs[b], acc[r][b]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) out[b * N + r] = _mm512_reduce_add_ps(acc[r][b]);
}
#endif

#if defined(__AVX512BF16__)
// R rows of bfloat16 weights against B rows of bfloat16 x, 32 products a step for each pair (vdpbf16ps: each product
// exact in float32, summed in float32), twice the float32 tile's products an instruction.
// out[b * N + r] = sum_i w_r[i] * x_b[i]; K a multiple of 32.
template <int R, int B>
inline void tile_bf16(const uint16_t* w, const uint16_t* x, int64_t K, float* out, int64_t N) {
  __m512 acc[R][B];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K; i += 32) {
    __m512bh xs[B];
    for (int b = 0; b < B; b++) xs[b] = (__m512bh)_mm512_loadu_si512(x + b * K + i);
    for (int r = 0; r < R; r++) {
      const __m512bh wr = (__m512bh)_mm512_loadu_si512(w + r * K + i);
      for (int b = 0; b < B; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wr, xs[b]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int b = 0; b < B; b++) out[b * N + r] = _mm512_reduce_add_ps(acc[r][b]);
}

// A rebuilt row of K float32 weights rounded to bfloat16 (nearest even, as torch's cast), 32 at a time.
inline void round_row_bf16(const float* y, int64_t K, uint16_t* w) {
  for (int64_t i = 0; i < K; i += 32) {
    const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(y + i + 16), _mm512_loadu_ps(y + i));
    _mm512_storeu_si512(w + i, (__m512i)pair);
  }
}
#endif

void check_codes(const at::Tensor& codes, int64_t type, int64_t K, const Format& f) {
  TORCH_CHECK(codes.device().is_cpu() && codes.scalar_type() == at::kByte && codes.dim() == 2 &&
                  codes.stride(1) == 1 && codes.stride(0) == codes.size(1),
              "codes must be a contiguous uint8 CPU [rows, bytes a row] tensor");
  TORCH_CHECK(K % f.weights == 0 && codes.size(1) == K / f.weights * f.bytes, "a row of ", K,
              " weights of GGUF type ", type, " takes ", K / f.weights * f.bytes, " bytes, not ", codes.size(1));
}

}  // namespace

// codes: uint8 [rows, bytes a row] of one GGUF tensor (or some of its rows); out: float32 or bfloat16 [rows, K],
// contiguous. Writes every weight, rebuilt as the reference does (bfloat16: rounded once, to nearest even).
void gguf_dequantize(at::Tensor codes, int64_t type, at::Tensor out) {
  const Format f = format_of(type);
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == codes.size(0) &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "out must be a contiguous float32 or bfloat16 [rows, weights a row] tensor");
  const int64_t rows = codes.size(0), K = out.size(1);
  check_codes(codes, type, K, f);
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const int64_t stride = codes.size(1);
  if (out.scalar_type() == at::kFloat) {
    float* Y = out.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) rebuild_row(f, C + r * stride, K, Y + r * K);
    });
    return;
  }
  at::BFloat16* Y = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(K);
    for (int64_t r = r0; r < r1; r++) {
      rebuild_row(f, C + r * stride, K, row.data());
      at::BFloat16* y = Y + r * K;
      for (int64_t i = 0; i < K; i++) y[i] = at::BFloat16(row[i]);  // round to nearest even, as torch's cast
    }
  });
}

// x: float32 [M, K] contiguous; codes: uint8 [N, bytes a row] (N outputs). Returns float32 [M, N] = x @ W.T, each
// output's weights rebuilt once into a row of float32 (in L1 or L2) and multiplied against every row of x.
at::Tensor gguf_codes_linear(at::Tensor x, at::Tensor codes, int64_t type) {
  const Format f = format_of(type);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 CPU [rows, inputs] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  check_codes(codes, type, K, f);
  auto out = at::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const int64_t stride = codes.size(1);
  float* O = out.data_ptr<float>();
  constexpr int R = 4;  // outputs rebuilt together
  at::parallel_for(0, (N + R - 1) / R, 4, [&](int64_t g0, int64_t g1) {
    std::vector<float> w(R * K);
    float sums[R];
    for (int64_t g = g0; g < g1; g++) {
      const int64_t n0 = g * R, rows = std::min<int64_t>(R, N - n0);
      for (int64_t r = 0; r < rows; r++) rebuild_row(f, C + (n0 + r) * stride, K, w.data() + r * K);
      int64_t m = 0;
#if defined(__AVX512F__)
      if (rows == R)
        for (; m + 4 <= M; m += 4) tile<R, 4>(w.data(), X + m * K, K, O + m * N + n0, N);
#endif
      for (; m < M; m++) {
        if (rows == R) {
          dots<R>(w.data(), X + m * K, K, sums);
        } else {
          for (int64_t r = 0; r < rows; r++) dots<1>(w.data() + r * K, X + m * K, K, sums + r);
        }
        for (int64_t r = 0; r < rows; r++) O[m * N + n0 + r] = sums[r];
      }
    }
  });
  return out;
}

// Whether gguf_codes_linear_bf16 was built: this CPU's compiler had AVX512_BF16.
bool gguf_bf16_dots() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// x: bfloat16 [M, K] contiguous; codes as gguf_codes_linear's. Returns float32 [M, N] = x @ W.T with each output's
// weights rebuilt once, rounded to bfloat16 (the weights a large pass's rebuilt bfloat16 matmul uses, to the bit) and
// multiplied against every row of x four rows at a time: a pass of a few dozen rows streams the codes once and never
// writes the whole weight out.
at::Tensor gguf_codes_linear_bf16(at::Tensor x, at::Tensor codes, int64_t type) {
#if !defined(__AVX512BF16__)
  TORCH_CHECK(false, "gguf_codes_linear_bf16 needs AVX512_BF16, which this build lacks (gguf_bf16_dots() is false)");
#else
  const Format f = format_of(type);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous bfloat16 CPU [rows, inputs] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = codes.size(0);
  check_codes(codes, type, K, f);
  TORCH_CHECK(K % 32 == 0, "inputs must be a multiple of 32, not ", K);
  auto out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const uint16_t* X = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const uint8_t* C = codes.data_ptr<uint8_t>();
  const int64_t stride = codes.size(1);
  float* O = out.data_ptr<float>();
  constexpr int R = 4;  // outputs rebuilt together
  at::parallel_for(0, (N + R - 1) / R, 4, [&](int64_t g0, int64_t g1) {
    std::vector<float> y(K);
    std::vector<uint16_t> w(R * K);
    for (int64_t g = g0; g < g1; g++) {
      const int64_t n0 = g * R, rows = std::min<int64_t>(R, N - n0);
      for (int64_t r = 0; r < rows; r++) {
        rebuild_row(f, C + (n0 + r) * stride, K, y.data());
        round_row_bf16(y.data(), K, w.data() + r * K);
      }
      int64_t m = 0;
      if (rows == R) {
        for (; m + 4 <= M; m += 4) tile_bf16<R, 4>(w.data(), X + m * K, K, O + m * N + n0, N);
        for (; m < M; m++) tile_bf16<R, 1>(w.data(), X + m * K, K, O + m * N + n0, N);
      } else {
        for (int64_t r = 0; r < rows; r++)
          for (m = 0; m < M; m++) tile_bf16<1, 1>(w.data() + r * K, X + m * K, K, O + m * N + n0 + r, N);
      }
    }
  });
  return out;
#endif
}
