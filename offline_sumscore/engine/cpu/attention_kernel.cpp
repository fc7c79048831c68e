// Attention for every token of a ragged pass on a CPU, in one call: each token reads its own slot's columns up to its
// own (the last `window` of them under a sliding window), and nothing else: no padding to the widest row, no mask
// tensor, no grid. A row feeding one token (decoding) runs its query heads one after another over its keys
// (one_head: scores 16 keys at a time into one vector, sum16). A row feeding more (a prompt, a draft) runs in blocks
// of its tokens with the queries in the lanes of a vector (block16): each key and value element is broadcast to the
// block's 16 queries at once, so the keys are read once a block, as they lie in the cache. e^x is a degree-7
// polynomial (exp16, in exp16.h, which native_build.py puts before this file), float32 throughout. Built at first
// use by attention_kernel.py (torch.utils.cpp_extension), for CPUs with AVX-512.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <vector>

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


// One block of a row's query tokens against its keys, queries in lanes: lane l is token t0 + l / group, query head
// l % group of kv head h (up to 16 lanes). Scores are kept key-major ([key][lane]), so the softmax runs down the
// keys with a lane per query, and keys and values are read as they lie in the cache, one element broadcast at a time.
// tok: the stride from one token to the next, in the queries and the output alike (both [tokens, kv, group, dim]).
template <int C>  // dim = 16 C
static void block16(const float* q, int64_t tok, int nt, int group, const float* kb, int64_t ks, const float* vb,
                    int64_t vs, int64_t first_col, int64_t window, float sc, float* qt, float* st, float* ot,
                    float* o) {
  constexpr int D = 16 * C;
  const int lanes = nt * group;
  alignas(64) int32_t col[16], low[16];
  for (int l = 0; l < 16; ++l) {
    const int tk = std::min(l, lanes - 1) / group;
    col[l] = static_cast<int32_t>(first_col + tk);
    low[l] = window > 0 ? static_cast<int32_t>(std::max<int64_t>(0, first_col + tk + 1 - window)) : 0;
  }
  for (int d = 0; d < D; ++d)
    for (int l = 0; l < 16; ++l)
      qt[d * 16 + l] = l < lanes ? q[(l / group) * tok + (l % group) * D + d] * sc : 0.0f;
  const __m512i colv = _mm512_load_si512(col), lowv = _mm512_load_si512(low);
  const int64_t j_lo = low[0], j_hi = col[lanes - 1] + 1, n = j_hi - j_lo;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 top = ninf;
  int64_t j = 0;
  auto keep = [&](int64_t jj, __m512 s) {
    const __m512i at = _mm512_set1_epi32(static_cast<int32_t>(j_lo + jj));
    const __mmask16 ok = _mm512_cmple_epi32_mask(at, colv) & _mm512_cmpge_epi32_mask(at, lowv);
    s = _mm512_mask_mov_ps(ninf, ok, s);
    _mm512_store_ps(st + jj * 16, s);
    top = _mm512_max_ps(top, s);
  };
  for (; j + 12 <= n; j += 12) {
    __m512 acc[12];
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_setzero_ps();
    const float* kj = kb + (j_lo + j) * ks;
    for (int d = 0; d < D; ++d) {
      const __m512 qv = _mm512_load_ps(qt + d * 16);
      for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(kj[k * ks + d]), qv, acc[k]);
    }
    for (int k = 0; k < 12; ++k) keep(j + k, acc[k]);
  }
  for (; j < n; ++j) {
    __m512 a = _mm512_setzero_ps();
    const float* kj = kb + (j_lo + j) * ks;
    for (int d = 0; d < D; ++d) a = _mm512_fmadd_ps(_mm512_set1_ps(kj[d]), _mm512_load_ps(qt + d * 16), a);
    keep(j, a);
  }
  __m512 total = _mm512_setzero_ps();
  for (j = 0; j < n; ++j) {
    const __m512 s = _mm512_load_ps(st + j * 16);
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ), exp16(_mm512_sub_ps(s, top)));
    _mm512_store_ps(st + j * 16, e);
    total = _mm512_add_ps(total, e);
  }
  for (int c = 0; c < C; ++c) {
    __m512 acc[16];
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
    for (j = 0; j < n; ++j) {
      const __m512 p = _mm512_load_ps(st + j * 16);
      const float* vj = vb + (j_lo + j) * vs + 16 * c;
      for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(vj[k]), p, acc[k]);
    }
    for (int k = 0; k < 16; ++k) _mm512_store_ps(ot + (16 * c + k) * 16, acc[k]);
  }
  alignas(64) float inv[16];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), total));
  for (int l = 0; l < lanes; ++l) {
    float* out = o + (l / group) * tok + (l % group) * D;
    for (int d = 0; d < D; ++d) out[d] = ot[d * 16 + l] * inv[l];
  }
}

// A piece of a pass's attention: one kv head of a row's tokens [t0, t0 + nt) (one token, or a block of 16 / group).
struct Item {
  int64_t row, h, t0, nt, cost;
};

// Every row's pieces, the costliest (most columns) first, as the threads take them: a long prompt's last blocks
// start first rather than leaving one thread alone with them at the end.
static std::vector<Item> work_items(const int64_t* rp, int64_t rows, int64_t kv, int64_t group) {
  std::vector<Item> items;
  const int64_t per_block = 16 / group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t count = rp[4 * r + 2], filled = rp[4 * r + 3];
    const int64_t step = count == 1 ? 1 : per_block;
    for (int64_t h = 0; h < kv; ++h)
      for (int64_t t0 = 0; t0 < count; t0 += step)
        items.push_back({r, h, t0, std::min(step, count - t0), filled + t0 + step});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  return items;
}

struct Pass {
  const float *q, *k, *v;
  float* o;
  int64_t ks0, ks1, ks2, vs0, vs1, vs2, q_tok, group, dim, window;
  float scale;
};

template <int C>
static void run_item(const Pass& p, const int64_t* rp, const Item& it, float* qt, float* st, float* ot,
                     const Levels& L) {
  const int64_t slot = rp[4 * it.row], first = rp[4 * it.row + 1], col = rp[4 * it.row + 3] + it.t0;
  const float* kb = p.k + slot * p.ks0 + it.h * p.ks1;
  const float* vb = p.v + slot * p.vs0 + it.h * p.vs1;
  const int64_t at = (first + it.t0) * p.q_tok + it.h * p.group * p.dim;
  if (it.nt == 1 && p.group < 8) {  // one token: its query heads one after another (too few to fill the lanes)
    const int64_t a = p.window > 0 ? std::max<int64_t>(0, col + 1 - p.window) : 0;
    one_head<C>(p.q + at, kb + a * p.ks2, p.ks2, vb + a * p.vs2, p.vs2, col + 1 - a, p.group, p.scale, st, p.o + at,
                L);
    return;
  }
  block16<C>(p.q + at, p.q_tok, static_cast<int>(it.nt), static_cast<int>(p.group), kb, p.ks2, vb, p.vs2, col,
             p.window, p.scale, qt, st, ot, p.o + at);
}

// query [tokens, kv, group, dim], the pass's tokens; rows [R, 4]: (slot, first token, tokens, columns before them).
// A row's token t (its first is 0) lies at column filled + t and attends its slot's columns up to its own (the last
// `window` of them where window > 0). Returns [tokens, kv, group, dim].
at::Tensor pass_attention(at::Tensor query, at::Tensor key, at::Tensor value, at::Tensor rows,
                             int64_t window, double scale) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
              value.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(query.dim() == 4 && query.is_contiguous() && key.stride(3) == 1 && value.stride(3) == 1,
              "query [tokens, kv heads, group, dim] contiguous; keys' and values' dim contiguous");
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous() && rows.dim() == 2 && rows.size(1) == 4,
              "rows: int64 [rows, 4]");
  const int64_t kv = query.size(1), group = query.size(2), dim = query.size(3);
  TORCH_CHECK(key.size(1) == kv && value.size(1) == kv && key.size(3) == dim && value.size(3) == dim,
              "keys and values [slots, ", kv, " kv heads, columns, ", dim, "]");
  TORCH_CHECK(dim % 16 == 0 && (dim <= 96 || dim == 128 || dim == 256), "no kernel for head dimension ", dim);
  TORCH_CHECK(group <= 16, "at most 16 query heads a kv head");
  const int64_t* rp = rows.data_ptr<int64_t>();
  int64_t widest = 0;
  for (int64_t r = 0; r < rows.size(0); ++r) {
    const int64_t slot = rp[4 * r], first = rp[4 * r + 1], count = rp[4 * r + 2], filled = rp[4 * r + 3];
    TORCH_CHECK(slot >= 0 && slot < key.size(0) && filled >= 0 && count >= 1 && filled + count <= key.size(2) &&
                first >= 0 && first + count <= query.size(0), "row ", r, " lies outside the tensors");
    widest = std::max(widest, filled + count);
  }
  auto out = at::empty_like(query);
  const Pass p{query.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(), out.data_ptr<float>(),
               key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
               kv * group * dim, group, dim, window, static_cast<float>(scale)};
  const std::vector<Item> items = work_items(rp, rows.size(0), kv, group);
  static const Levels L;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(items.size()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    // Scratch: the block's queries and outputs transposed ([dim][16] each), its scores [columns][16]; 64-byte aligned.
    std::vector<float> buffer(static_cast<size_t>((widest + 16) * 16 + 2 * dim * 16 + 16));
    float* qt = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
    float* ot = qt + dim * 16;
    float* st = ot + dim * 16;
    for (int64_t i = next++; i < static_cast<int64_t>(items.size()); i = next++) {
      switch (dim / 16) {
        case 1: run_item<1>(p, rp, items[i], qt, st, ot, L); break;
        case 2: run_item<2>(p, rp, items[i], qt, st, ot, L); break;
        case 3: run_item<3>(p, rp, items[i], qt, st, ot, L); break;
        case 4: run_item<4>(p, rp, items[i], qt, st, ot, L); break;
        case 5: run_item<5>(p, rp, items[i], qt, st, ot, L); break;
        case 6: run_item<6>(p, rp, items[i], qt, st, ot, L); break;
        case 8: run_item<8>(p, rp, items[i], qt, st, ot, L); break;
        case 16: run_item<16>(p, rp, items[i], qt, st, ot, L); break;
      }
    }
  });
  return out;
}
