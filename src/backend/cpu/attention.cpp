#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

namespace lily::cpu {
namespace {

constexpr int64_t kBlockRows = 16;

// Row t and query heads [h0, h0 + nh) of one KV head: one dot product and one axpy per key and head, the
// heads inner so that each key and value row is read from memory once for all of them (fp32 rows of hd: they
// stay in L1 across the heads). Per head the arithmetic is the same for any nh.
void one_row(const AttnArgs& a, const AttnSeq& s, int64_t t, int64_t h0, int64_t nh, std::vector<float>& sc) {
  const int64_t hd = a.hd, kvw = a.Hkv * hd, kh = h0 / (a.Hq / a.Hkv);
  const int64_t n = s.pos0 + (t - s.first) + 1;
  const float* q = a.q + (t * a.Hq + h0) * hd;
  float* o = a.o + (t * a.Hq + h0) * hd;
  sc.resize(size_t(nh * n));
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = s.k + j * kvw + kh * hd;
    for (int64_t g = 0; g < nh; ++g) sc[size_t(g * n + j)] = dot(q + g * hd, kr, hd) * a.scale;
  }
  float inv[64];
  for (int64_t g = 0; g < nh; ++g) {
    float* row = sc.data() + g * n;
    const float mx = *std::max_element(row, row + n);
    inv[g] = 1.0f / exp_shift_sum(row, n, mx);
  }
  std::fill(o, o + nh * hd, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = s.v + j * kvw + kh * hd;
    for (int64_t g = 0; g < nh; ++g) axpy(sc[size_t(g * n + j)] * inv[g], vr, o + g * hd, hd);
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
  const int64_t nh = int64_t(single.size()) * a.Hkv >= int64_t(pool.size()) && grp <= 64 ? grp : 1, per = a.Hq / nh;
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
