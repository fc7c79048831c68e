// Attention for the decoding rows of a ragged pass on a CPU: each query row reads its own slot's columns
// [start, stop) of the keys and values, and nothing else (no padding to the widest row, no mask). The query heads of
// a kv group are computed one after another over the same keys, which the first of them brings into the cache.
// Scores go 16 keys at a time into one vector (sum16), e^x is a degree-7 polynomial (exp16), float32 throughout.
// Built at first use by decode_kernel.py (torch.utils.cpp_extension), for CPUs with AVX-512.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <vector>

// e^x for x <= 0, 16 lanes: x = k ln2 + r, e^r by its Taylor polynomial to r^7, times 2^k (scalef).
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

// One combining level of the 16-vector sum: A and B each hold S sources in blocks of 2h lanes; the result holds
// A's S sources then B's, each in a block of h lanes (the sum of its block's two halves).
static inline __m512 combine(__m512 a, __m512 b, const __m512i& lo, const __m512i& hi) {
  return _mm512_add_ps(_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b));
}

struct Levels {
  __m512i lo[4], hi[4];
  Levels() {
    for (int level = 0; level < 4; ++level) {
      const int S = 1 << level, h = 8 >> level;
      alignas(64) int32_t l[16], u[16];
      for (int lane = 0; lane < 16; ++lane) {
        const int k = lane / h, o = lane % h, from_b = k >= S, s = from_b ? k - S : k;
        l[lane] = s * 2 * h + o + (from_b ? 16 : 0);
        u[lane] = s * 2 * h + h + o + (from_b ? 16 : 0);
      }
      lo[level] = _mm512_load_si512(l);
      hi[level] = _mm512_load_si512(u);
    }
  }
};

// x[0..16) -> one vector whose lane i is the sum of x[i]'s lanes.
static inline __m512 sum16(__m512* x, const Levels& L) {
  for (int level = 0, n = 16; level < 4; ++level, n /= 2)
    for (int i = 0; i < n / 2; ++i) x[i] = combine(x[2 * i], x[2 * i + 1], L.lo[level], L.hi[level]);
  return x[0];
}

template <int C>  // dim = 16 C
static void one_head(const float* q, const float* kb, int64_t ks, const float* vb, int64_t vs, int64_t n, int64_t group,
                     float sc, float* scores, float* out, const Levels& L) {
  for (int64_t g = 0; g < group; ++g) {
    __m512 qv[C];
    for (int c = 0; c < C; ++c) qv[c] = _mm512_mul_ps(_mm512_loadu_ps(q + g * 16 * C + 16 * c), _mm512_set1_ps(sc));
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      __m512 acc[16];
      for (int t = 0; t < 16; ++t) {
        const float* kj = kb + (j + t) * ks;
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
        for (int c = 1; c < C; ++c) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), a);
        acc[t] = a;
      }
      _mm512_storeu_ps(scores + j, sum16(acc, L));
    }
    for (; j < n; ++j) {
      const float* kj = kb + j * ks;
      __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
      for (int c = 1; c < C; ++c) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), a);
      scores[j] = _mm512_reduce_add_ps(a);
    }
    // softmax over scores[0, n)
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (j = 0; j + 16 <= n; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(scores + j));
    float m = _mm512_reduce_max_ps(top);
    for (; j < n; ++j) m = std::max(m, scores[j]);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 total = _mm512_setzero_ps();
    for (j = 0; j + 16 <= n; j += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), mv));
      _mm512_storeu_ps(scores + j, e);
      total = _mm512_add_ps(total, e);
    }
    if (j < n) {
      const __mmask16 tail = (__mmask16)((1u << (n - j)) - 1);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + j), mv));
      _mm512_mask_storeu_ps(scores + j, tail, e);
      total = _mm512_add_ps(total, _mm512_maskz_mov_ps(tail, e));
    }
    const float inv = 1.0f / _mm512_reduce_add_ps(total);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (j = 0; j < n; ++j) {
      const __m512 w = _mm512_set1_ps(scores[j]);
      const float* vj = vb + j * vs;
      for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vj + 16 * c), acc[c]);
    }
    const __m512 iv = _mm512_set1_ps(inv);
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * 16 * C + 16 * c, _mm512_mul_ps(acc[c], iv));
  }
}

// query [m, kv, group, dim]: m query rows, the query heads of kv head h at [., h]; row i reads slot slots[i]'s
// columns [starts[i], stops[i]) of key and value [slots, kv, columns, dim] (dim contiguous). Returns [m, kv, group,
// dim].
torch::Tensor decode_attention(torch::Tensor query, torch::Tensor key, torch::Tensor value, torch::Tensor slots,
                               torch::Tensor starts, torch::Tensor stops, double scale) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat32 && key.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(query.is_contiguous() && key.stride(3) == 1 && value.stride(3) == 1, "dim must be contiguous");
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && starts.scalar_type() == torch::kInt64 &&
              stops.scalar_type() == torch::kInt64, "slots, starts and stops: int64");
  const int64_t m = query.size(0), kv = query.size(1), group = query.size(2), dim = query.size(3);
  TORCH_CHECK(key.size(1) == kv && value.size(1) == kv && key.size(3) == dim && value.size(3) == dim,
              "keys and values [slots, ", kv, " kv heads, columns, ", dim, "]");
  TORCH_CHECK(dim % 16 == 0 && (dim <= 96 || dim == 128 || dim == 256), "no kernel for head dimension ", dim);
  auto out = torch::empty_like(query);
  const float* qp = query.data_ptr<float>();
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* ap = starts.data_ptr<int64_t>();
  const int64_t* bp = stops.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t ks0 = key.stride(0), ks1 = key.stride(1), ks2 = key.stride(2);
  const int64_t vs0 = value.stride(0), vs1 = value.stride(1), vs2 = value.stride(2);
  const float sc = static_cast<float>(scale);
  static const Levels L;
  at::parallel_for(0, m * kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = i / kv, h = i % kv, a = ap[row], n = bp[row] - a;
      scores.resize(n + 16);
      const float* kb = kp + sp[row] * ks0 + h * ks1 + a * ks2;
      const float* vb = vp + sp[row] * vs0 + h * vs1 + a * vs2;
      const float* q = qp + i * group * dim;
      float* o = op + i * group * dim;
      switch (dim / 16) {
        case 1: one_head<1>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 2: one_head<2>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 3: one_head<3>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 4: one_head<4>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 5: one_head<5>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 6: one_head<6>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 8: one_head<8>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
        case 16: one_head<16>(q, kb, ks2, vb, vs2, n, group, sc, scores.data(), o, L); break;
      }
    }
  });
  return out;
}
