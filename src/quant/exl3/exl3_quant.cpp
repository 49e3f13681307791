#include "quant/exl3/exl3_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace lily::quant {

double exl3_codebook_std(Exl3Codebook cb) {
  static double sd[3] = {0, 0, 0};
  double& r = sd[size_t(cb)];
  if (r == 0) {
    const float* l = exl3_lut(cb);
    double m = 0, q = 0;
    for (int s = 0; s < 65536; ++s) m += l[s];
    m /= 65536;
    for (int s = 0; s < 65536; ++s) q += (l[s] - m) * (l[s] - m);
    r = std::sqrt(q / 65536);
  }
  return r;
}

namespace {

constexpr float kInf = 1e30f;

// One Viterbi run over the positions order[0..255]. start_edge >= 0 forces (s_first >> K) == start_edge,
// end_edge >= 0 forces (s_last & (2^(16−K) − 1)) == end_edge. Writes states[order[i]]; returns the cost.
// Costs live per 16-bit state; "edge" e = the low 16−K bits of s_{t−1} = the high 16−K bits of s_t, so
// the best predecessor of every state with edge e is one min over the 2^K states (hi << (16−K)) | e.
// Only those per-edge minima are kept per step (no backpointers: the hot loop is a plain vector min);
// the backtrack re-evaluates the 2^K predecessor costs of the one state it follows.
// K is a template parameter so that the inner loops have constant trip counts and vectorise.
template <int K>
float viterbi(const float* v, const int* order, const float* lut, int start_edge, int end_edge, uint16_t* states,
              ViterbiScratch& S) {
  constexpr int E = 16 - K;
  constexpr uint32_t NE = 1u << E, NK = 1u << K;
  // m_i[e] = best cost of a path over positions 0..i−1 ending in a state with low bits e (i = 1..255).
  // K >= 3 keeps every m_i (256 · NE floats, ≤ 8 MiB). K <= 2 keeps m_1 and every 16th m_i and recomputes
  // a 16-step segment at a time during the backtrack (NE is 16-32 K edges there).
  constexpr bool kAll = K >= 3;
  constexpr size_t kRows = kAll ? 256 : 16 + 16 + 2;
  S.edge_min.resize(kRows * NE);
  float* store = S.edge_min.data();
  auto cost0 = [&](uint32_t s) {
    const float d = lut[s] - v[order[0]];
    return start_edge >= 0 && (s >> K) != uint32_t(start_edge) ? kInf : d * d;
  };
  typedef float v8 __attribute__((vector_size(32)));  // GCC vector extension: one AVX register
  // m_{i+1}[e'] = min over states s with low bits e' of (err_i(s) + m_i[s >> K]); costs are never stored.
  // K <= 3: the states with low bits in the block [q·2^K, (q+1)·2^K) are s = (h << E) | (q << K) | c: their
  // predecessor edge is q + h·NQ and their codebook entries lut[(q << K) + h·NE + c]. So each target block is a
  // register min over h, stored once; U independent accumulators hide the min's latency, and 8 / 2^K blocks
  // share one vector when K < 3 (their codebook entries are contiguous). K >= 4: that order reads 2^K codebook
  // streams NE floats apart (same L1 sets), so the loop runs over edges instead and updates each edge's
  // 2^K contiguous targets in memory.
  auto step = [&](const float* __restrict m, float* __restrict mn, float x) {
    constexpr uint32_t NQ = NE >> K;
    const v8 xv = {x, x, x, x, x, x, x, x};
    if constexpr (K >= 4) {
      for (uint32_t e = 0; e < NE; ++e) mn[e] = kInf * 2;
      for (uint32_t e = 0; e < NE; ++e) {
        const float mv = m[e];
        const v8 mvv = {mv, mv, mv, mv, mv, mv, mv, mv};
        const float* l = lut + (e << K);
        float* t = mn + ((e << K) & (NE - 1));
        for (uint32_t c = 0; c < NK; c += 8) {
          v8 lv, tv;
          std::memcpy(&lv, l + c, sizeof lv);
          std::memcpy(&tv, t + c, sizeof tv);
          const v8 d = lv - xv;
          const v8 val = d * d + mvv;
          tv = val < tv ? val : tv;
          std::memcpy(t + c, &tv, sizeof tv);
        }
      }
    } else {
      constexpr uint32_t G = K == 3 ? 1 : 8 / NK;  // target blocks a vector covers
      constexpr uint32_t U = 4;                    // vectors in flight
      static_assert(NQ % (G * U) == 0);
      for (uint32_t q0 = 0; q0 < NQ; q0 += G * U) {
        v8 acc[U];
        for (uint32_t u = 0; u < U; ++u) acc[u] = v8{} + kInf * 2;
        for (uint32_t h = 0; h < NK; ++h) {
          for (uint32_t u = 0; u < U; ++u) {
            const uint32_t q = q0 + u * G;
            const float* mp = m + q + h * NQ;
            v8 mvv;
            if constexpr (G == 1) {
              mvv = v8{} + mp[0];
            } else {
#if defined(__AVX2__)
              // in-register broadcast of the G minima (a lane-by-lane build goes through the stack and stalls)
              const __m128 raw =
                  G == 4 ? _mm_loadu_ps(mp) : _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(mp)));
              const __m256i idx = _mm256_setr_epi32(0 / NK, 1 / NK, 2 / NK, 3 / NK, 4 / NK, 5 / NK, 6 / NK, 7 / NK);
              mvv = (v8)_mm256_permutevar8x32_ps(_mm256_castps128_ps256(raw), idx);
#else
              for (int c = 0; c < 8; ++c) mvv[c] = mp[uint32_t(c) / NK];
#endif
            }
            v8 lv;
            std::memcpy(&lv, lut + (q << K) + h * NE, sizeof lv);
            const v8 d = lv - xv;
            const v8 val = d * d + mvv;
            acc[u] = val < acc[u] ? val : acc[u];
          }
        }
        for (uint32_t u = 0; u < U; ++u) std::memcpy(mn + ((q0 + u * G) << K), &acc[u], sizeof(v8));
      }
    }
  };
  // Row of the store holding m_i in the forward pass (kAll: row i; else checkpoints 0..15 = m_1, m_16,
  // m_32, ..., m_240; rows 32, 33 roll).
  auto ckpt_row = [](int i) { return i == 1 ? 0 : i / 16; };
  auto fwd_row = [&](int i) -> float* {
    if constexpr (kAll) return store + size_t(i) * NE;
    if (i == 1 || i % 16 == 0) return store + size_t(ckpt_row(i)) * NE;
    return store + size_t(32 + (i & 1)) * NE;
  };
  {
    float* m1 = fwd_row(1);
    std::fill(m1, m1 + NE, kInf * 2);
    for (uint32_t s = 0; s < 65536; ++s) m1[s & (NE - 1)] = std::min(m1[s & (NE - 1)], cost0(s));
  }
  for (int i = 1; i < 255; ++i) step(fwd_row(i), fwd_row(i + 1), v[order[i]]);
  uint32_t best = 0;
  float bc = kInf * 2;
  {
    const float* m = fwd_row(255);
    const float x = v[order[255]];
    for (uint32_t s = 0; s < 65536; ++s) {
      if (end_edge >= 0 && (s & (NE - 1)) != uint32_t(end_edge)) continue;
      const float d = lut[s] - x;
      const float c = d * d + m[s >> K];
      if (c < bc) {
        bc = c;
        best = s;
      }
    }
  }
  // Backtrack; for K <= 2, m_j comes from a recomputed segment (rows 16..31 = m_b .. m_{b+15}).
  int seg_base = -1;
  auto m_at = [&](int j) -> const float* {
    if constexpr (kAll) return store + size_t(j) * NE;
    const int b = j < 16 ? 1 : j / 16 * 16;
    if (b != seg_base) {
      float* seg = store + size_t(16) * NE;
      std::memcpy(seg, store + size_t(ckpt_row(b)) * NE, NE * sizeof(float));
      const int last = std::min(b + 15, 255);
      for (int u = 1; b + u <= last; ++u) step(seg + size_t(u - 1) * NE, seg + size_t(u) * NE, v[order[b + u - 1]]);
      seg_base = b;
    }
    return store + size_t(16 + (j - b)) * NE;
  };
  uint32_t s = best;
  for (int i = 255; i >= 1; --i) {
    states[order[i]] = uint16_t(s);
    const uint32_t e = s >> K;
    const float* mp = i - 1 >= 1 ? m_at(i - 1) : nullptr;
    uint32_t arg = e;
    float bcost = kInf * 4;
    for (uint32_t hi = 0; hi < NK; ++hi) {
      const uint32_t p = (hi << E) | e;
      float c;
      if (!mp) {
        c = cost0(p);
      } else {
        const float d = lut[p] - v[order[i - 1]];
        c = d * d + mp[p >> K];
      }
      if (c < bcost) {
        bcost = c;
        arg = p;
      }
    }
    s = arg;
  }
  states[order[0]] = uint16_t(s);
  return bc;
}

using ViterbiFn = float (*)(const float*, const int*, const float*, int, int, uint16_t*, ViterbiScratch&);
const ViterbiFn kViterbi[9] = {nullptr,    viterbi<1>, viterbi<2>, viterbi<3>, viterbi<4>,
                               viterbi<5>, viterbi<6>, viterbi<7>, viterbi<8>};

struct Orders {
  int plain[256], rotated[256];
  Orders() {
    for (int i = 0; i < 256; ++i) {
      plain[i] = i;
      rotated[i] = (i + 128) % 256;
    }
  }
};

int64_t round128(int64_t v) { return (v + 127) / 128 * 128; }

// Blockwise (128) Hadamard along rows (each row's columns) of a row-major [rows, cols] double matrix.
void had_rows(double* a, int64_t rows, int64_t cols) {
  const double s = 1.0 / std::sqrt(128.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols; b += 128) {
      double* v = a + r * cols + b;
      for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
          for (int j = i; j < i + h; ++j) {
            double x = v[j], y = v[j + h];
            v[j] = x + y;
            v[j + h] = x - y;
          }
      for (int i = 0; i < 128; ++i) v[i] *= s;
    }
}

// Blockwise Hadamard along columns (mixes rows) of a row-major [rows, cols] matrix.
void had_cols(double* a, int64_t rows, int64_t cols) {
  std::vector<double> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[r * cols + c];
  had_rows(t.data(), cols, rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) a[r * cols + c] = t[size_t(c * rows + r)];
}

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline float f16r(double v) { return f16_to_f32(f32_to_f16(float(v))); }

// Cholesky H = C Cᵀ (lower, in place); false when H is not positive definite.
bool cholesky(std::vector<double>& H, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = H[size_t(j * n + j)];
    for (int64_t k = 0; k < j; ++k) d -= H[size_t(j * n + k)] * H[size_t(j * n + k)];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    H[size_t(j * n + j)] = d;
    for (int64_t i = j + 1; i < n; ++i) {
      double s = H[size_t(i * n + j)];
      for (int64_t k = 0; k < j; ++k) s -= H[size_t(i * n + k)] * H[size_t(j * n + k)];
      H[size_t(i * n + j)] = s / d;
    }
    for (int64_t k = j + 1; k < n; ++k) H[size_t(j * n + k)] = 0;
  }
  return true;
}

}  // namespace

double exl3_encode_tile(const float* v, int K, Exl3Codebook cb, uint16_t* states, ViterbiScratch& S) {
  if (K < 1 || K > 8) fail("EXL3 K = {} unsupported (1..8)", K);
  static const Orders O;
  const float* lut = exl3_lut(cb);
  uint16_t tmp[256];
  kViterbi[K](v, O.rotated, lut, -1, -1, tmp, S);
  const int edge = int(tmp[0] >> K);
  kViterbi[K](v, O.plain, lut, edge, edge, states, S);
  double err = 0;
  for (int t = 0; t < 256; ++t) {
    const double d = double(lut[states[t]]) - v[t];
    err += d * d;
  }
  return err;
}

Exl3Weight Exl3Quantized::view() const {
  Exl3Weight w;
  w.K = K;
  w.codebook = codebook;
  w.in = in;
  w.out = out;
  w.in_p = in_p;
  w.out_p = out_p;
  w.trellis = trellis.data();
  w.suh = suh.data();
  w.svh = svh.data();
  w.bias = bias.empty() ? nullptr : bias.data();
  return w;
}

Exl3Quantized exl3_quantize(const float* W, int64_t out, int64_t in, const float* bias, const Exl3QuantOptions& opt) {
  if (opt.K < 1 || opt.K > 8) fail("EXL3 bits per weight K = {} unsupported (1..8)", opt.K);
  if (out <= 0 || in <= 0) fail("EXL3: cannot quantize a [{}, {}] matrix", out, in);
  const int64_t kp = round128(in), np = round128(out);
  Exl3Quantized q;
  q.K = opt.K;
  q.codebook = opt.codebook;
  q.in = in;
  q.out = out;
  q.in_p = kp;
  q.out_p = np;
  // k-major, zero-padded copy.
  std::vector<double> M(static_cast<size_t>(kp * np), 0.0);
  for (int64_t n = 0; n < out; ++n)
    for (int64_t k = 0; k < in; ++k) M[size_t(k * np + n)] = W[n * in + k];
  uint64_t rng = opt.seed * 0x632BE59BD9B4E019ull + 12345;
  std::vector<double> su(static_cast<size_t>(kp)), sv(static_cast<size_t>(np));
  for (auto& s : su) s = (splitmix(rng) & 1) ? -1.0 : 1.0;
  for (auto& s : sv) s = (splitmix(rng) & 1) ? -1.0 : 1.0;
  // Output channel scales (RMS over k, normalised to mean 1 over non-zero channels).
  std::vector<double> ocs(static_cast<size_t>(np), 0.0);
  std::vector<char> zero_col(static_cast<size_t>(np), 0);
  double mean = 0;
  int64_t nz = 0;
  for (int64_t n = 0; n < np; ++n) {
    double s = 0;
    for (int64_t k = 0; k < kp; ++k) s += M[size_t(k * np + n)] * M[size_t(k * np + n)];
    ocs[size_t(n)] = std::sqrt(s / double(kp));
    if (ocs[size_t(n)] > 0) {
      mean += ocs[size_t(n)];
      ++nz;
    }
  }
  mean = nz ? mean / double(nz) : 1.0;
  for (int64_t n = 0; n < np; ++n) {
    if (ocs[size_t(n)] > 0) {
      sv[size_t(n)] = f16r(sv[size_t(n)] * ocs[size_t(n)] / mean);
      if (sv[size_t(n)] == 0) sv[size_t(n)] = f16r(std::copysign(6.2e-5, sv[size_t(n)]));
    } else {
      zero_col[size_t(n)] = 1;
    }
  }
  for (int64_t k = 0; k < kp; ++k)
    for (int64_t n = 0; n < np; ++n)
      if (!zero_col[size_t(n)]) M[size_t(k * np + n)] /= sv[size_t(n)];
  had_rows(M.data(), kp, np);
  // Input channel scales: rows of the rotated matrix to the codebook's spread.
  const double target = exl3_codebook_std(opt.codebook);
  double rmean = 0;
  std::vector<double> ics(static_cast<size_t>(kp));
  for (int64_t k = 0; k < kp; ++k) {
    double s = 0;
    for (int64_t n = 0; n < np; ++n) s += M[size_t(k * np + n)] * M[size_t(k * np + n)];
    ics[size_t(k)] = std::sqrt(s / double(np));
    rmean += ics[size_t(k)];
  }
  rmean /= double(kp);
  for (int64_t k = 0; k < kp; ++k) {
    double r = ics[size_t(k)] > 1e-6 * rmean ? ics[size_t(k)] : (rmean > 0 ? rmean : 1.0);
    su[size_t(k)] = f16r(-su[size_t(k)] * r / target);
    if (su[size_t(k)] == 0) su[size_t(k)] = f16r(std::copysign(6.2e-5, -su[size_t(k)]));
    for (int64_t n = 0; n < np; ++n) M[size_t(k * np + n)] /= su[size_t(k)];
  }
  had_cols(M.data(), kp, np);

  // LDLQ factor of the rotated, damped Hessian (rows = inputs k).
  const int64_t nb = kp / 16;
  std::vector<double> L;  // [kp, kp] unit lower block-triangular, diagonal blocks zeroed
  std::vector<double> Hr;
  if (opt.hessian) {
    Hr.assign(static_cast<size_t>(kp * kp), 0.0);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < in; ++j) Hr[size_t(i * kp + j)] = opt.hessian[i * in + j] * su[size_t(i)] * su[size_t(j)];
    had_rows(Hr.data(), kp, kp);
    had_cols(Hr.data(), kp, kp);
    double dm = 0;
    for (int64_t i = 0; i < kp; ++i) dm += Hr[size_t(i * kp + i)];
    dm = dm / double(kp);
    if (dm > 0) {
      for (int64_t i = 0; i < kp; ++i) Hr[size_t(i * kp + i)] += opt.damp * dm;
      L = Hr;
      if (!cholesky(L, kp)) L.clear();
    }
    if (!L.empty()) {
      // L ← C · blockdiag(C_bb)⁻¹, then drop the (identity) diagonal blocks.
      for (int64_t b = 0; b < nb; ++b) {
        double inv[16][16] = {};
        for (int i = 0; i < 16; ++i) {  // invert the lower-triangular 16x16 block
          inv[i][i] = 1.0 / L[size_t((16 * b + i) * kp + 16 * b + i)];
          for (int j = 0; j < i; ++j) {
            double s = 0;
            for (int k = j; k < i; ++k) s += L[size_t((16 * b + i) * kp + 16 * b + k)] * inv[k][j];
            inv[i][j] = -s * inv[i][i];
          }
        }
        for (int64_t r = 16 * (b + 1); r < kp; ++r) {
          double row[16];
          for (int j = 0; j < 16; ++j) {
            double s = 0;
            for (int k = j; k < 16; ++k) s += L[size_t(r * kp + 16 * b + k)] * inv[k][j];
            row[j] = s;
          }
          for (int j = 0; j < 16; ++j) L[size_t(r * kp + 16 * b + j)] = row[j];
        }
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 16; ++j) L[size_t((16 * b + i) * kp + 16 * b + j)] = 0;
      }
    }
  }

  const int64_t tn = np / 16;
  q.trellis.assign(static_cast<size_t>(nb * tn * 16 * opt.K), 0);
  std::vector<double> Q(static_cast<size_t>(kp * np), 0.0);  // decoded values of finished strips
  const float* lut = exl3_lut(opt.codebook);
  const uint8_t* perm = exl3_tc_perm();
  auto encode_tiles = [&](const std::vector<double>& target, int64_t strip0, int64_t nstrips) {
    // target: rows 16·strip0 .. 16·(strip0 + nstrips), all np columns.
    auto fn = [&](int64_t b, int64_t e) {
      thread_local ViterbiScratch S;
      float v[256];
      uint16_t st[256];
      for (int64_t id = b; id < e; ++id) {
        const int64_t si = id / tn, j = id % tn, i = strip0 + si;
        for (int t = 0; t < 256; ++t) {
          const int r = perm[t] / 16, c = perm[t] % 16;
          v[t] = float(target[size_t((16 * si + r) * np + 16 * j + c)]);
        }
        exl3_encode_tile(v, opt.K, opt.codebook, st, S);
        exl3_pack_tile(st, opt.K, q.trellis.data() + (i * tn + j) * 16 * opt.K);
        for (int t = 0; t < 256; ++t) {
          const int r = perm[t] / 16, c = perm[t] % 16;
          Q[size_t((16 * i + r) * np + 16 * j + c)] = lut[st[t]];
        }
      }
      if (opt.progress) opt.progress(opt.progress_ctx, e - b);
    };
    const int64_t n = nstrips * tn;
    if (opt.threaded) ThreadPool::global().parallel_for(n, 1, fn);
    else fn(0, n);
  };
  if (L.empty()) {
    encode_tiles(M, 0, nb);
  } else {
    std::vector<double> target(static_cast<size_t>(16 * np));
    for (int64_t b = nb - 1; b >= 0; --b) {
      // target = W_b + Σ_{rows r > b} L[r, b-block]ᵀ (W − Q)[r]
      for (int i = 0; i < 16; ++i)
        for (int64_t n = 0; n < np; ++n) target[size_t(i * np + n)] = M[size_t((16 * b + i) * np + n)];
      for (int64_t r = 16 * (b + 1); r < kp; ++r) {
        const double* lr = L.data() + r * kp + 16 * b;
        const double* mr = M.data() + r * np;
        const double* qr = Q.data() + r * np;
        for (int i = 0; i < 16; ++i) {
          const double l = lr[i];
          if (l == 0) continue;
          double* t = target.data() + i * np;
          for (int64_t n = 0; n < np; ++n) t[n] += l * (mr[n] - qr[n]);
        }
      }
      encode_tiles(target, b, 1);
    }
  }
  // Proxy error in the rotated basis: tr(Eᵀ H E) / tr(Wᵀ H W) (H = I without calibration).
  {
    double num = 0, den = 0;
    if (Hr.empty()) {
      for (size_t i = 0; i < M.size(); ++i) {
        num += (M[i] - Q[i]) * (M[i] - Q[i]);
        den += M[i] * M[i];
      }
    } else {
      std::vector<double> hx(static_cast<size_t>(kp));
      const int64_t step = std::max<int64_t>(1, kp * kp * np / 500000000);  // column sample on big layers
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t n = 0; n < np; n += step) {
          for (int64_t k = 0; k < kp; ++k) {
            double s = 0;
            for (int64_t j = 0; j < kp; ++j) {
              const double x = pass ? M[size_t(j * np + n)] : M[size_t(j * np + n)] - Q[size_t(j * np + n)];
              s += Hr[size_t(k * kp + j)] * x;
            }
            hx[size_t(k)] = s;
          }
          double acc = 0;
          for (int64_t k = 0; k < kp; ++k)
            acc += hx[size_t(k)] * (pass ? M[size_t(k * np + n)] : M[size_t(k * np + n)] - Q[size_t(k * np + n)]);
          (pass ? den : num) += acc;
        }
    }
    q.proxy_err = den > 0 ? num / den : 0.0;
  }
  q.suh.resize(static_cast<size_t>(kp));
  q.svh.resize(static_cast<size_t>(np));
  for (int64_t k = 0; k < kp; ++k) q.suh[size_t(k)] = f32_to_f16(float(su[size_t(k)]));
  for (int64_t n = 0; n < np; ++n) q.svh[size_t(n)] = zero_col[size_t(n)] ? 0 : f32_to_f16(float(sv[size_t(n)]));
  if (bias) {
    q.bias.assign(static_cast<size_t>(np), 0);
    for (int64_t n = 0; n < out; ++n) q.bias[size_t(n)] = f32_to_f16(bias[n]);
  }
  return q;
}

}  // namespace lily::quant
