#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace lily::cpu {
namespace {

constexpr int64_t kBlockRows = 16;

// Cached rows this far ahead of the one in use are prefetched: [n][Hkv·hd] interleaves the KV heads, so a
// thread's head is 1 of every Hkv stretches of hd floats and the hardware prefetchers, which follow
// contiguous lines, leave its rows to demand misses (measured: ~2 GB/s per thread without).
constexpr int64_t kAhead = 4;
constexpr int64_t kHeads = 4;   // query heads per pass: one load of a key / value chunk feeds their 4 products
constexpr int64_t kKeyBlk = 16;  // keys per pass of the output accumulation (the output stays in registers)

inline void prefetch_row(const float* p, int64_t hd) {
  for (int64_t c = 0; c < hd; c += 16) __builtin_prefetch(p + c);
}

// sc[g·n + j] = q_g · kr · scale for the gn (<= kHeads) heads of q. Every multiply-add is an explicit fused
// one (the compiler's contraction could differ between a head's paths), so a head's sum is the same for any gn.
inline void dots(const float* q, int64_t hd, int64_t gn, const float* kr, float scale, float* sc, int64_t n) {
  v8f a0[kHeads] = {}, a1[kHeads] = {};
  int64_t i = 0;
  for (; i + 16 <= hd; i += 16) {
    const v8f k0 = load8(kr + i), k1 = load8(kr + i + 8);
    for (int64_t g = 0; g < gn; ++g) {
      a0[g] = fmadd8(load8(q + g * hd + i), k0, a0[g]);
      a1[g] = fmadd8(load8(q + g * hd + i + 8), k1, a1[g]);
    }
  }
  if (i + 8 <= hd) {
    const v8f k0 = load8(kr + i);
    for (int64_t g = 0; g < gn; ++g) a0[g] = fmadd8(load8(q + g * hd + i), k0, a0[g]);
    i += 8;
  }
  for (int64_t g = 0; g < gn; ++g) {
    float s = hsum(a0[g] + a1[g]);
    for (int64_t r = i; r < hd; ++r) s = __builtin_fmaf(q[g * hd + r], kr[r], s);
    sc[g * n] = s * scale;
  }
}

// Row t and query heads [h0, h0 + nh) of one KV head: the heads inner, so that each key and value row is read
// from memory once for all of them. Per head the arithmetic is the same for any nh: its scores as in dots(),
// its output the sum over keys in order (o = fma(w_j, v_j, o)).
void one_row(const AttnArgs& a, const AttnSeq& s, int64_t t, int64_t h0, int64_t nh, std::vector<float>& sc) {
  const int64_t hd = a.hd, kvw = a.Hkv * hd, kh = h0 / (a.Hq / a.Hkv);
  const int64_t n = s.pos0 + (t - s.first) + 1;
  const float* q = a.q + (t * a.Hq + h0) * hd;
  float* o = a.o + (t * a.Hq + h0) * hd;
  sc.resize(size_t(nh * n));
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = s.k + j * kvw + kh * hd;
    if (j + kAhead < n) prefetch_row(kr + kAhead * kvw, hd);
    for (int64_t g0 = 0; g0 < nh; g0 += kHeads)
      dots(q + g0 * hd, hd, std::min(kHeads, nh - g0), kr, a.scale, sc.data() + g0 * n + j, n);
  }
  for (int64_t g = 0; g < nh; ++g) {
    float* row = sc.data() + g * n;
    const float mx = *std::max_element(row, row + n);
    const float inv = 1.0f / exp_shift_sum(row, n, mx);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  }
  std::fill(o, o + nh * hd, 0.0f);
  const int64_t hv = hd / 8 * 8;
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlk) {
    const int64_t jn = std::min(kKeyBlk, n - j0);
    const float* v0 = s.v + j0 * kvw + kh * hd;
    for (int64_t j = 0; j < jn && j0 + jn + j < n; ++j) prefetch_row(v0 + (jn + j) * kvw, hd);
    for (int64_t g0 = 0; g0 < nh; g0 += kHeads) {
      const int64_t gn = std::min(kHeads, nh - g0);
      const float* w = sc.data() + g0 * n + j0;
      for (int64_t i = 0; i < hv; i += 8) {
        v8f acc[kHeads];
        for (int64_t g = 0; g < gn; ++g) acc[g] = load8(o + (g0 + g) * hd + i);
        for (int64_t j = 0; j < jn; ++j) {
          const v8f v = load8(v0 + j * kvw + i);
          for (int64_t g = 0; g < gn; ++g) {
            const float wj = w[g * n + j];
            acc[g] = fmadd8(v8f{wj, wj, wj, wj, wj, wj, wj, wj}, v, acc[g]);
          }
        }
        for (int64_t g = 0; g < gn; ++g) store8(o + (g0 + g) * hd + i, acc[g]);
      }
      for (int64_t i = hv; i < hd; ++i)
        for (int64_t g = 0; g < gn; ++g) {
          float& y = o[(g0 + g) * hd + i];
          for (int64_t j = 0; j < jn; ++j) y = __builtin_fmaf(w[g * n + j], v0[j * kvw + i], y);
        }
    }
  }
  for (int64_t g = 0; g < nh; ++g) mul_sigmoid(o + g * hd, a.gate + t * a.gate_ts + (h0 + g) * a.gate_hs, hd);
}

// Rows [r0, r0 + br) of sequence s (relative to s.first) for the query heads of KV head kh: scores
// S = Q·Kᵀ (M = br·grp rows of Q, keys up to the last row's position, Kᵀ from kt: [hd][ldk]), a masked
// softmax per row, O = P·V.
void block_rows(const AttnArgs& a, const AttnSeq& s, const float* kt, int64_t ldk, int64_t kh, int64_t r0, int64_t br,
                std::vector<float>& qb, std::vector<float>& sb, std::vector<float>& ob) {
  const int64_t hd = a.hd, kvw = a.Hkv * hd, grp = a.Hq / a.Hkv, M = br * grp;
  const int64_t n = s.pos0 + r0 + br;  // keys the block's last row sees
  qb.resize(size_t(M * hd));
  sb.resize(size_t(M * n));
  ob.resize(size_t(M * hd));
  for (int64_t r = 0; r < br; ++r)
    for (int64_t g = 0; g < grp; ++g)
      std::copy_n(a.q + ((s.first + r0 + r) * a.Hq + kh * grp + g) * hd, hd, qb.data() + (r * grp + g) * hd);
  gemm_nn(M, n, hd, qb.data(), hd, 1, kt, ldk, sb.data(), n, false);
  std::vector<float> inv(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    float* row = sb.data() + i * n;
    const int64_t ni = s.pos0 + r0 + i / grp + 1;  // causal: keys 0..pos
    float mx = -INFINITY;
    for (int64_t j = 0; j < ni; ++j) mx = std::max(mx, row[j] *= a.scale);
    inv[size_t(i)] = 1.0f / exp_shift_sum(row, ni, mx);
    std::fill(row + ni, row + n, 0.0f);
  }
  gemm_nn(M, hd, n, sb.data(), n, 1, s.v + kh * hd, kvw, ob.data(), hd, false);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t t = s.first + r0 + i / grp, h = kh * grp + i % grp;
    float* o = a.o + (t * a.Hq + h) * hd;
    const float* src = ob.data() + i * hd;
    for (int64_t d = 0; d < hd; ++d) o[d] = src[d] * inv[size_t(i)];
    mul_sigmoid(o, a.gate + t * a.gate_ts + h * a.gate_hs, hd);
  }
}

}  // namespace

void attention(const AttnArgs& a, const std::vector<AttnSeq>& seqs) {
  auto& pool = ThreadPool::global();
  // Rows of short sequences, one task per (row, head).
  std::vector<std::pair<const AttnSeq*, int64_t>> single;
  for (const AttnSeq& s : seqs)
    if (s.rows < std::max<int64_t>(1, a.block_min_rows))
      for (int64_t i = 0; i < s.rows; ++i) single.push_back({&s, s.first + i});
  // A task per (row, KV head) reads each cached row once for its query heads; a task per (row, head) when
  // that would leave threads idle.
  const int64_t grp = a.Hq / a.Hkv;
  const int64_t nh = int64_t(single.size()) * a.Hkv >= int64_t(pool.size()) ? grp : 1, per = a.Hq / nh;
  pool.parallel_for(int64_t(single.size()) * per, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc;
    for (int64_t i = i0; i < i1; ++i) {
      const auto& [seq, t] = single[size_t(i / per)];
      one_row(a, *seq, t, (i % per) * nh, nh, sc);
    }
  });
  // Long sequences: keys transposed once per sequence ([Hkv][hd][n]), then one task per (KV head, block of rows).
  const int64_t hd = a.hd, kvw = a.Hkv * hd;
  for (const AttnSeq& s : seqs) {
    if (s.rows < std::max<int64_t>(1, a.block_min_rows)) continue;
    const int64_t n = s.pos0 + s.rows;
    std::vector<float> kt(size_t(a.Hkv * hd * n));
    pool.parallel_for(a.Hkv * hd, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t j = 0; j < n; ++j) kt[size_t(c * n + j)] = s.k[j * kvw + c];
    });
    const int64_t blocks = (s.rows + kBlockRows - 1) / kBlockRows;
    pool.parallel_for(a.Hkv * blocks, 1, [&](int64_t i0, int64_t i1) {
      std::vector<float> qb, sb, ob;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t kh = i / blocks, r0 = (i % blocks) * kBlockRows;
        block_rows(a, s, kt.data() + kh * hd * n, n, kh, r0, std::min(kBlockRows, s.rows - r0), qb, sb, ob);
      }
    });
  }
}

}  // namespace lily::cpu
