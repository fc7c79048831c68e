// The elementwise parts of a Llama-style decoder layer on a CPU, each one pass over its tensors where torch takes
// several: RMSNorm (torch: square, mean, add, rsqrt, two products: four reads and three writes of the hidden states),
// SiLU times the up projection (torch: silu, then the product, over the MLP's widest activations), and rotary
// position embedding (torch: two products, a concatenation, a negation and a sum per query and key). Float32, AVX-512,
// threads through torch's own OpenMP runtime; e^x from exp16.h (native_build.py puts it before this file). Built at
// first use by layer_ops.py (torch.utils.cpp_extension).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// The lanes of a 16-wide chunk that lie before the end, `left` elements away.
static inline __mmask16 lanes(int64_t left) { return left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1); }

static void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
}

// weight * (x * rsqrt(mean(x^2) + eps)) over the last dimension, with the products in transformers' order.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check(x, "x");
  check(weight, "weight");
  const int64_t H = x.size(-1), T = x.numel() / H;
  TORCH_CHECK(weight.numel() == H, "weight must hold one value per feature");
  auto out = at::empty_like(x);
  const float *X = x.data_ptr<float>(), *W = weight.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, T, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = X + t * H;
      __m512 squares = _mm512_setzero_ps();
      for (int64_t h = 0; h < H; h += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(lanes(H - h), row + h);
        squares = _mm512_fmadd_ps(v, v, squares);
      }
      const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / (float)H + (float)eps));
      for (int64_t h = 0; h < H; h += 16) {
        const __mmask16 m = lanes(H - h);
        const __m512 normed = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + h), inv);
        _mm512_mask_storeu_ps(O + t * H + h, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, W + h), normed));
      }
    }
  });
  return out;
}

// gate <- silu(gate) * up, in place (gate is the gate projection's fresh output). sigmoid(x) from e^-|x|, so the
// exponential never overflows: 1 / (1 + e^-x) for x >= 0, e^x / (1 + e^x) below.
at::Tensor silu_mul_(at::Tensor gate, at::Tensor up) {
  check(gate, "gate");
  check(up, "up");
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have one shape");
  const int64_t n = gate.numel();
  float* G = gate.data_ptr<float>();
  const float* U = up.data_ptr<float>();
  at::parallel_for(0, (n + 15) / 16, 256, [&](int64_t begin, int64_t end) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t i = begin * 16; i < std::min(end * 16, n); i += 16) {
      const __mmask16 m = lanes(n - i);
      const __m512 x = _mm512_maskz_loadu_ps(m, G + i);
      const __m512 e = exp16(_mm512_sub_ps(zero, _mm512_abs_ps(x)));
      const __m512 top = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ), e, one);
      const __m512 silu = _mm512_mul_ps(x, _mm512_div_ps(top, _mm512_add_ps(one, e)));
      _mm512_mask_storeu_ps(G + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, U + i)));
    }
  });
  return gate;
}

// out = x * cos + rotate_half(x) * sin for x [B, T, heads, D], cos and sin [B, T, D]. Two products, then their sum,
// each rounded as torch rounds it (built without FMA contraction): the same bits as transformers' own.
static at::Tensor rotate(const at::Tensor& x, const float* C, const float* S) {
  const int64_t BT = x.size(0) * x.size(1), heads = x.size(2), D = x.size(3), half = D / 2;
  auto out = at::empty_like(x);
  const float* X = x.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, BT, 16, [&](int64_t begin, int64_t end) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t bt = begin; bt < end; ++bt) {
      const float *c = C + bt * D, *s = S + bt * D;
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = X + (bt * heads + h) * D;
        float* o = O + (bt * heads + h) * D;
        for (int64_t d = 0; d < half; d += 16) {
          const __mmask16 m = lanes(half - d);
          const __m512 x1 = _mm512_maskz_loadu_ps(m, in + d), x2 = _mm512_maskz_loadu_ps(m, in + half + d);
          const __m512 lo = _mm512_mul_ps(_mm512_sub_ps(zero, x2), _mm512_maskz_loadu_ps(m, s + d));
          const __m512 hi = _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m, s + half + d));
          _mm512_mask_storeu_ps(o + d, m, _mm512_add_ps(_mm512_mul_ps(x1, _mm512_maskz_loadu_ps(m, c + d)), lo));
          _mm512_mask_storeu_ps(o + half + d, m,
                                _mm512_add_ps(_mm512_mul_ps(x2, _mm512_maskz_loadu_ps(m, c + half + d)), hi));
        }
      }
    }
  });
  return out;
}

// Queries and keys [B, T, heads, D] (contiguous), cos and sin [B, T, D]: both rotated, into new tensors.
std::vector<at::Tensor> rotary(at::Tensor q, at::Tensor k, at::Tensor cos, at::Tensor sin) {
  for (auto* t : {&q, &k, &cos, &sin}) check(*t, "rotary's inputs");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.sizes() == cos.sizes(), "rotary's shapes");
  TORCH_CHECK(q.size(0) == cos.size(0) && q.size(1) == cos.size(1) && q.size(3) == cos.size(2) &&
                  k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) && q.size(3) % 2 == 0,
              "rotary: q, k [B, T, heads, D] and cos, sin [B, T, D], D even");
  const float *C = cos.data_ptr<float>(), *S = sin.data_ptr<float>();
  return {rotate(q, C, S), rotate(k, C, S)};
}
