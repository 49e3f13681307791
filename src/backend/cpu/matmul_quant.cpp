// CPU products against quantized weights, straight from the packed bytes (no dequantised copy of W):
//   affine: 4/8-bit with AffinePath::Int8 go to the int8-activation kernels (affine_int8.h). The exact
//           (float activation) path: up to 8 rows unpack 4/8-bit codes in registers per group; otherwise
//           each thread dequantises one weight row at a time and dots it with all T activation rows;
//   exl3:   x is rotated once (x ⊙ suh, Hadamard per 128 block); each thread owns output tile columns,
//           decodes one 16x16 tile at a time and applies it to all T rows; the output Hadamard, svh,
//           bias and the output-row gather follow.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/affine_int8.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_observer.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"

namespace lily::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Few activation rows, 4- or 8-bit codes: codes are unpacked in registers one group at a time and each
// row computes Σ_g s_g·(q_g·x_g) + b_g·Σx_g, so no dequantised row is written.
template <int BITS>
void affine_matmul_few_rows(const quant::AffineWeight& q, const float* x, int64_t T, float* y, int64_t ldy) {
  const int64_t out = q.out, in = q.in, G = q.groups(), gs = q.group_size, nv = gs / 8;
  std::vector<float> xsum(static_cast<size_t>(T * G));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      float sx = 0;
      for (int64_t i = 0; i < gs; ++i) sx += x[t * in + g * gs + i];
      xsum[size_t(t * G + g)] = sx;
    }
  const int64_t grain = std::max<int64_t>(4, (int64_t(1) << 15) / std::max<int64_t>(1, in));
  ThreadPool::global().parallel_for(out, grain, [&](int64_t o0, int64_t o1) {
    v8f cv[16];
    for (int64_t o = o0; o < o1; ++o) {
      const uint8_t* row = reinterpret_cast<const uint8_t*>(q.packed + o * q.row_words);
      v8f acc[8] = {};
      float bias_acc[8] = {};
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t v = 0; v < nv; ++v) {
          if constexpr (BITS == 4) {
            uint32_t w;
            std::memcpy(&w, row + (g * gs + v * 8) / 2, 4);
            const v8u32 wv = {w, w, w, w, w, w, w, w};
            const v8u32 sh = {0, 4, 8, 12, 16, 20, 24, 28};
            cv[v] = __builtin_convertvector((wv >> sh) & 15u, v8f);
          } else {
            typedef uint8_t v8u8 __attribute__((vector_size(8)));
            v8u8 b;
            std::memcpy(&b, row + g * gs + v * 8, 8);
            cv[v] = __builtin_convertvector(b, v8f);
          }
        }
        const float s = quant::affine_scale(q, o, g), b = quant::affine_bias(q, o, g);
        const v8f sv = {s, s, s, s, s, s, s, s};
        for (int64_t t = 0; t < T; ++t) {
          const float* xg = x + t * in + g * gs;
          v8f a = {};
          for (int64_t v = 0; v < nv; ++v) a += cv[v] * load8(xg + v * 8);
          acc[t] += sv * a;
          bias_acc[t] += b * xsum[size_t(t * G + g)];
        }
      }
      for (int64_t t = 0; t < T; ++t) y[t * ldy + o] = hsum(acc[t]) + bias_acc[t];
    }
  });
}

void affine_matmul(const quant::AffineWeight& q, const float* x, int64_t T, float* y, AffinePath path) {
  const int64_t out = q.out, in = q.in;
  if (path == AffinePath::Int8 && affine_int8_supported(q)) return affine_matmul_int8(q, x, T, y);
  // Blocks of up to 8 rows through the register kernel: a row's result does not depend on T.
  if ((q.bits == 4 || q.bits == 8) && q.group_size % 8 == 0 && q.group_size <= 128) {
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
      const int64_t n = std::min<int64_t>(8, T - t0);
      if (q.bits == 4) affine_matmul_few_rows<4>(q, x + t0 * in, n, y + t0 * out, out);
      else affine_matmul_few_rows<8>(q, x + t0 * in, n, y + t0 * out, out);
    }
    return;
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, in / 64));
  ThreadPool::global().parallel_for(out, grain, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = b; o < e; ++o) {
      quant::affine_dequant_row(q, o, row.data());
      for (int64_t t = 0; t < T; ++t) y[t * out + o] = dot(row.data(), x + t * in, in);
    }
  });
}

void exl3_matmul(const quant::Exl3Weight& w, const float* x, int64_t T, float* y) {
  const int64_t kp = w.in_p, np = w.out_p, tk = w.tiles_k();
  std::vector<float> xh(static_cast<size_t>(T * kp)), acc(static_cast<size_t>(T * np), 0.0f);
  auto& pool = ThreadPool::global();
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* d = xh.data() + t * kp;
      const float* s = x + t * w.in;
      for (int64_t k = 0; k < w.in; ++k) d[k] = s[k] * f16_to_f32(w.suh[k]);
      std::fill(d + w.in, d + kp, 0.0f);
      for (int64_t k = 0; k < kp; k += 128) quant::had128(d + k);
    }
  });
  // 128-column output blocks that any logical output reads.
  std::vector<char> need(static_cast<size_t>(np / 128), 0);
  for (int64_t j = 0; j < w.out; ++j) need[size_t(w.column(j) / 128)] = 1;
  std::vector<int64_t> cols;  // tile columns to compute
  for (int64_t b = 0; b < np / 128; ++b)
    if (need[size_t(b)])
      for (int64_t c = 0; c < 8; ++c) cols.push_back(b * 8 + c);
  pool.parallel_for(int64_t(cols.size()), 1, [&](int64_t b, int64_t e) {
    alignas(64) float tile[256];
    for (int64_t ci = b; ci < e; ++ci) {
      const int64_t j = cols[size_t(ci)];
      for (int64_t i = 0; i < tk; ++i) {
        quant::exl3_decode_tile(w.tile(i, j), w.K, w.codebook, tile);
        for (int64_t t = 0; t < T; ++t) {
          const float* xs = xh.data() + t * kp + 16 * i;
          float* a = acc.data() + t * np + 16 * j;
          float r[16];
          std::memcpy(r, a, sizeof r);
          for (int rr = 0; rr < 16; ++rr) {
            const float xv = xs[rr];
            const float* tr = tile + rr * 16;
            for (int c = 0; c < 16; ++c) r[c] += xv * tr[c];
          }
          std::memcpy(a, r, sizeof r);
        }
      }
    }
  });
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* a = acc.data() + t * np;
      for (int64_t blk = 0; blk < np / 128; ++blk)
        if (need[size_t(blk)]) quant::had128(a + blk * 128);
      for (int64_t j = 0; j < w.out; ++j) {
        const int64_t n = w.column(j);
        float v = a[n] * f16_to_f32(w.svh[n]);
        if (w.bias) v += f16_to_f32(w.bias[n]);
        y[t * w.out + j] = v;
      }
    }
  });
}

void check(const Linear& W) {
  if (W.format == WeightFormat::Affine) {
    LILY_ASSERT(W.affine && W.affine->out == W.out && W.affine->in == W.in);
  } else if (W.format == WeightFormat::Exl3) {
    LILY_ASSERT(W.exl3 && W.exl3->out == W.out && W.exl3->in == W.in);
  } else {
    fail("{}: {} is not a quantized format", W.name, format_name(W.format));
  }
}

}  // namespace

namespace {
AffinePath env_affine_path() {
  const char* e = std::getenv("LILY_CPU_AFFINE");
  const std::string v = e ? e : "";
  if (v.empty() || v == "int8") return AffinePath::Int8;
  if (v == "exact") return AffinePath::Exact;
  fail("LILY_CPU_AFFINE='{}': expected 'int8' or 'exact'", v);
}
std::atomic<int> g_affine_path{-1};  // -1: not read from the environment yet
}  // namespace

AffinePath affine_path_default() {
  int p = g_affine_path.load(std::memory_order_relaxed);
  if (p < 0) {
    p = int(env_affine_path());
    g_affine_path.store(p, std::memory_order_relaxed);
  }
  return AffinePath(p);
}

void set_affine_path_default(AffinePath p) { g_affine_path.store(int(p), std::memory_order_relaxed); }

void matmul_quantized(const Linear& W, const float* x, int64_t T, float* y, AffinePath path) {
  check(W);
  if (T <= 0) return;
  if (W.format == WeightFormat::Affine) affine_matmul(*W.affine, x, T, y, path);
  else exl3_matmul(*W.exl3, x, T, y);
}

void matmul_batch(std::span<const MatJob> jobs, AffinePath path) {
  std::vector<Int8Job> int8;
  for (const MatJob& j : jobs) {
    const Linear& W = *j.W;
    if (W.format == WeightFormat::Affine && path == AffinePath::Int8 && j.T > 0) {
      check(W);
      if (affine_int8_supported(*W.affine)) {
        observe_matmul(W, j.x, j.T);  // as matmul() does
        int8.push_back({W.affine.get(), j.x, j.T, j.y});
        continue;
      }
    }
    matmul(W, j.x, j.T, j.y, path);
  }
  if (!int8.empty()) affine_matmul_int8_batch(int8);
}

void matmul_quantized_ref(const Linear& W, const float* x, int64_t T, float* y) {
  check(W);
  if (W.format == WeightFormat::Exl3) {
    quant::exl3_forward_ref(*W.exl3, x, T, y);
    return;
  }
  const auto& q = *W.affine;
  std::vector<float> row(static_cast<size_t>(q.in));
  for (int64_t o = 0; o < q.out; ++o) {
    quant::affine_dequant_row_ref(q, o, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t i = 0; i < q.in; ++i) s += double(row[size_t(i)]) * x[t * q.in + i];
      y[t * q.out + o] = float(s);
    }
  }
}

void weight_row_quantized(const Linear& W, int64_t row, float* out) {
  check(W);
  if (row < 0 || row >= W.out) fail("{}: row {} out of range [0, {})", W.name, row, W.out);
  if (W.format == WeightFormat::Affine) quant::affine_dequant_row(*W.affine, row, out);
  else quant::exl3_weight_column(*W.exl3, row, out);
}

}  // namespace lily::cpu

namespace lily::cpu {

namespace {
MatmulObserver g_observer = nullptr;
void* g_observer_ctx = nullptr;
}  // namespace

void set_matmul_observer(MatmulObserver fn, void* ctx) {
  g_observer = fn;
  g_observer_ctx = ctx;
}

void observe_matmul(const Linear& W, const float* x, int64_t T) {
  if (g_observer) g_observer(g_observer_ctx, W, x, T);
}

}  // namespace lily::cpu
