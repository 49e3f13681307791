// Small portable SIMD helpers (GCC/Clang vector extensions; AVX2/AVX-512 with -march=native).
#pragma once
#include <cstdint>
#include <cstring>

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

}  // namespace lily::cpu
