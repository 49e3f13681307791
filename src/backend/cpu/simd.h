// Small portable SIMD helpers (GCC/Clang vector extensions; AVX2/AVX-512 with -march=native).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace lily::cpu {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

// 8 bf16 values -> fp32 (exact: bf16 is the top half of fp32).
inline v8f load8_bf16(const uint16_t* p) {
  v8u16 h;
  std::memcpy(&h, p, sizeof h);
  v8u32 w = __builtin_convertvector(h, v8u32) << 16;
  v8f f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

// a * b + c rounded once (a fused multiply-add where the CPU has one), never left to the compiler's
// contraction choice: kernels that must agree bit for bit use it.
inline v8f fmadd8(v8f a, v8f b, v8f c) {
#if defined(__FMA__)
  return __builtin_ia32_vfmaddps256(a, b, c);
#else
  v8f r;
  for (int i = 0; i < 8; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#endif
}

typedef int32_t v8i __attribute__((vector_size(32)));

// The first n (< 8 allowed) floats of p, zeros after; and its store.
inline v8f load_n(const float* p, int64_t n) {
  if (n == 8) return load8(p);  // a plain vector load, not a memcpy call
  v8f v = {};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store_n(float* p, v8f v, int64_t n) {
  if (n == 8) return store8(p, v);
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}

// Per lane: m ? a : b (m from a vector comparison: all ones or zeros).
inline v8f select8(v8i m, v8f a, v8f b) { return (v8f)(((v8i)a & m) | ((v8i)b & ~m)); }

// Per lane: x truncated toward zero; NaN and out-of-range lanes give INT_MIN, as x86's conversion does (a
// plain __builtin_convertvector of them is undefined, which clang exploits).
inline v8i cvtt8(v8f x) {
#if defined(__AVX__)
  return (v8i)__builtin_ia32_cvttps2dq256(x);
#else
  x = select8(x == x && x < 2147483648.0f && x >= -2147483648.0f, x, v8f{} - 2147483648.0f);
  return __builtin_convertvector(x, v8i);
#endif
}

// e^x per lane: x = n·ln2 + r with |r| <= ln2/2 (ln2 in two parts), a degree-7 polynomial for e^r, 2^n built in
// the exponent bits. Within 2 ulp of e^x on [-87, 88]; outside, the input is clamped there (results
// 1.6e-38 and 1.7e38: still finite and normal). NaN stays NaN. A lane depends on its own input alone, so a
// value gives the same result in any lane and through load_n tails.
inline v8f exp8(v8f x) {
  const v8f hi = v8f{} + 88.0f, lo = v8f{} - 87.0f;
  x = select8(x > hi, hi, x);
  x = select8(x < lo, lo, x);
  const v8f fx = x * 1.44269504088896341f + 0.5f;
  v8f n = __builtin_convertvector(cvtt8(fx), v8f);
  n = select8(n > fx, n - 1.0f, n);  // floor (the conversion truncates toward zero)
  const v8f r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
  return p * (v8f)e;
}
inline v8f sigmoid8(v8f v) { return 1.0f / (1.0f + exp8(-v)); }
inline v8f silu8(v8f v) { return v / (1.0f + exp8(-v)); }

inline float hsum(v8f v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

inline float dot(const float* a, const float* b, int64_t n) {
  v8f acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
  float s = hsum(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] += a * x[i]
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const v8f av = {a, a, a, a, a, a, a, a};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + av * load8(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

// C[i·ldc + j] (+)= Σ_k A(i, k) · B[k·ldb + j] for i < M, j < N, with A(i, k) = A[i·a_is + k·a_ks] (any
// layout: its elements are broadcast) and B, C contiguous along j. Blocks of 4 rows x 16 columns keep 8
// vector accumulators; per k, 2 loads of B and 4 broadcasts feed 8 multiply-adds (no horizontal sums).
inline void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_is, int64_t a_ks, const float* B,
                    int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  constexpr int R = 4, V = 2;  // rows, vectors of 8 columns (measured best of 2-8 x 1-4 here)
  auto block = [&](int64_t i, int64_t rows, int64_t j, auto nv_tag) {
    constexpr int NV = decltype(nv_tag)::value;
    v8f c[R][NV];
    for (int u = 0; u < R; ++u)
      for (int w = 0; w < NV; ++w) c[u][w] = (accumulate && u < rows) ? load8(C + (i + u) * ldc + j + 8 * w) : v8f{};
    for (int64_t k = 0; k < K; ++k) {
      v8f b[NV];
#pragma GCC unroll 4
      for (int w = 0; w < NV; ++w) b[w] = load8(B + k * ldb + j + 8 * w);
#pragma GCC unroll 4
      for (int u = 0; u < R; ++u) {
        const float av = u < rows ? A[(i + u) * a_is + k * a_ks] : 0.0f;
        const v8f a8 = {av, av, av, av, av, av, av, av};
#pragma GCC unroll 4
        for (int w = 0; w < NV; ++w) c[u][w] += a8 * b[w];
      }
    }
    for (int u = 0; u < rows; ++u)
      for (int w = 0; w < NV; ++w) store8(C + (i + u) * ldc + j + 8 * w, c[u][w]);
  };
  for (int64_t i = 0; i < M; i += R) {
    const int64_t rows = std::min<int64_t>(R, M - i);
    int64_t j = 0;
    for (; j + 8 * V <= N; j += 8 * V) block(i, rows, j, std::integral_constant<int, V>{});
    for (; j + 8 <= N; j += 8) block(i, rows, j, std::integral_constant<int, 1>{});
    for (; j < N; ++j)  // last columns one at a time
      for (int64_t u = 0; u < rows; ++u) {
        float t = 0;
        for (int64_t k = 0; k < K; ++k) t += A[(i + u) * a_is + k * a_ks] * B[k * ldb + j];
        C[(i + u) * ldc + j] = accumulate ? C[(i + u) * ldc + j] + t : t;
      }
  }
}

}  // namespace lily::cpu
