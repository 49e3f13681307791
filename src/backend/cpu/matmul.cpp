#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_observer.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "backend/cpu/simd.h"

namespace lily::cpu {

namespace {

// Converts `n` elements of a dense row to float32.
void row_to_f32(const DenseWeight& w, int64_t row, int64_t n, float* out) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data) + size_t(row * w.row_stride) * dtype_size(w.dtype);
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(out, base, size_t(n) * 4);
      break;
    case DType::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(base);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) store8(out + i, load8_bf16(p + i));
      for (; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::F16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      break;
    }
    default:
      throw InternalError("dense weight with non-float dtype");
  }
}

// Every output element is computed with the same arithmetic whichever kernel computes it and however
// many rows the product has (batch invariance: a row's result must not depend on what it is batched
// with): 8-wide chunks multiply-added into one vector accumulator in order, hsum, then the scalar tail.
inline float dot_inv(const float* x, const float* w, int64_t n) {
  v8f a = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) a = fmadd8(load8(x + i), load8(w + i), a);
  float s = hsum(a);
  for (; i < n; ++i) s = __builtin_fmaf(x[i], w[i], s);
  return s;
}

// acc[r][c] = dot(x[r], w[c]) for 2 x-rows and 4 w-rows of length n (dot_inv's arithmetic per element).
inline void kernel_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                       const float* w3, int64_t n, float out[2][4]) {
  v8f a00 = {}, a01 = {}, a02 = {}, a03 = {}, a10 = {}, a11 = {}, a12 = {}, a13 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f p0 = load8(x0 + i), p1 = load8(x1 + i);
    v8f q0 = load8(w0 + i), q1 = load8(w1 + i), q2 = load8(w2 + i), q3 = load8(w3 + i);
    a00 = fmadd8(p0, q0, a00); a01 = fmadd8(p0, q1, a01); a02 = fmadd8(p0, q2, a02); a03 = fmadd8(p0, q3, a03);
    a10 = fmadd8(p1, q0, a10); a11 = fmadd8(p1, q1, a11); a12 = fmadd8(p1, q2, a12); a13 = fmadd8(p1, q3, a13);
  }
  float s[2][4] = {{hsum(a00), hsum(a01), hsum(a02), hsum(a03)}, {hsum(a10), hsum(a11), hsum(a12), hsum(a13)}};
  const float* w[4] = {w0, w1, w2, w3};
  for (; i < n; ++i)
    for (int c = 0; c < 4; ++c) {
      s[0][c] = __builtin_fmaf(x0[i], w[c][i], s[0][c]);
      s[1][c] = __builtin_fmaf(x1[i], w[c][i], s[1][c]);
    }
  std::memcpy(out, s, sizeof s);
}

constexpr int64_t kRowBlock = 16;  // weight rows converted to fp32 per block (16 x in floats, L1/L2 resident)

// One activation row against bf16 weights: converted in registers, no staging buffer; four weight rows
// at a time (independent accumulators), each with dot_inv's arithmetic.
void gemv_bf16(const Linear& W, const float* x, float* y) {
  const int64_t N = W.out, K = W.in;
  auto work = [&](int64_t r0, int64_t r1) {
    const uint16_t* base = static_cast<const uint16_t*>(W.dense.data);
    const int64_t ld = W.dense.row_stride;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      const uint16_t *w0 = base + r * ld, *w1 = w0 + ld, *w2 = w1 + ld, *w3 = w2 + ld;
      v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
      int64_t i = 0;
      for (; i + 8 <= K; i += 8) {
        const v8f xv = load8(x + i);
        a0 = fmadd8(xv, load8_bf16(w0 + i), a0); a1 = fmadd8(xv, load8_bf16(w1 + i), a1);
        a2 = fmadd8(xv, load8_bf16(w2 + i), a2); a3 = fmadd8(xv, load8_bf16(w3 + i), a3);
      }
      float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
      for (; i < K; ++i) {
        s0 = __builtin_fmaf(x[i], bf16_to_f32(w0[i]), s0); s1 = __builtin_fmaf(x[i], bf16_to_f32(w1[i]), s1);
        s2 = __builtin_fmaf(x[i], bf16_to_f32(w2[i]), s2); s3 = __builtin_fmaf(x[i], bf16_to_f32(w3[i]), s3);
      }
      y[r] = s0; y[r + 1] = s1; y[r + 2] = s2; y[r + 3] = s3;
    }
    for (; r < r1; ++r) {
      const uint16_t* w = base + r * ld;
      v8f a = {};
      int64_t i = 0;
      for (; i + 8 <= K; i += 8) a = fmadd8(load8(x + i), load8_bf16(w + i), a);
      float s = hsum(a);
      for (; i < K; ++i) s = __builtin_fmaf(x[i], bf16_to_f32(w[i]), s);
      y[r] = s;
    }
  };
  if (N * K < (int64_t(1) << 16))
    work(0, N);
  else
    ThreadPool::global().parallel_for(N, std::max<int64_t>(8, (int64_t(1) << 14) / K), work);
}

void matmul_dense(const Linear& W, const float* x, int64_t T, float* y) {
  const int64_t N = W.out, K = W.in;
  if (T == 1 && W.dense.dtype == DType::BF16) return gemv_bf16(W, x, y);
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  // Small products run on the calling thread: the pool's hand-off costs more than they do.
  int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, K * T * kRowBlock) );
  auto work = [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> wbuf;
    wbuf.resize(static_cast<size_t>(kRowBlock * K));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, nr = std::min(kRowBlock, N - r0);
      for (int64_t r = 0; r < nr; ++r) row_to_f32(W.dense, r0 + r, K, wbuf.data() + r * K);
      int64_t t = 0;
      for (; t + 2 <= T; t += 2) {
        const float* x0 = x + t * K;
        const float* x1 = x0 + K;
        int64_t r = 0;
        for (; r + 4 <= nr; r += 4) {
          float o[2][4];
          const float* w = wbuf.data() + r * K;
          kernel_2x4(x0, x1, w, w + K, w + 2 * K, w + 3 * K, K, o);
          for (int c = 0; c < 4; ++c) {
            y[t * N + r0 + r + c] = o[0][c];
            y[(t + 1) * N + r0 + r + c] = o[1][c];
          }
        }
        for (; r < nr; ++r) {
          y[t * N + r0 + r] = dot_inv(x0, wbuf.data() + r * K, K);
          y[(t + 1) * N + r0 + r] = dot_inv(x1, wbuf.data() + r * K, K);
        }
      }
      for (; t < T; ++t)
        for (int64_t r = 0; r < nr; ++r) y[t * N + r0 + r] = dot_inv(x + t * K, wbuf.data() + r * K, K);
    }
  };
  if (blocks * K * T < (int64_t(1) << 15))
    work(0, blocks);
  else
    ThreadPool::global().parallel_for(blocks, grain, work);
}

}  // namespace

void matmul(const Linear& W, const float* x, int64_t T, float* y, AffinePath path) {
  if (T <= 0 || W.out == 0) return;
  observe_matmul(W, x, T);  // calibration capture (backend/cpu/matmul_observer.h); no-op unless set
  if (W.format == WeightFormat::Dense)
    matmul_dense(W, x, T, y);
  else
    matmul_quantized(W, x, T, y, path);
}

void matmul_ref(const Linear& W, const float* x, int64_t T, float* y) {
  if (W.format != WeightFormat::Dense) return matmul_quantized_ref(W, x, T, y);
  std::vector<float> row(static_cast<size_t>(W.in));
  for (int64_t n = 0; n < W.out; ++n) {
    row_to_f32(W.dense, n, W.in, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < W.in; ++k) s += double(x[t * W.in + k]) * double(row[size_t(k)]);
      y[t * W.out + n] = float(s);
    }
  }
}

void weight_row(const Linear& W, int64_t row, float* out) {
  LILY_ASSERT(row >= 0 && row < W.out);
  if (W.format == WeightFormat::Dense)
    row_to_f32(W.dense, row, W.in, out);
  else
    weight_row_quantized(W, row, out);
}

}  // namespace lily::cpu
