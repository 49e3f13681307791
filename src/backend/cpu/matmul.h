// CPU matrix products against Linear weights of any format, float32 activations.
//   y[T, out] = x[T, in] · Wᵀ
// matmul is threaded and vectorised; matmul_ref is the plain loop it is tested against.
#pragma once
#include <cstdint>
#include <span>

#include "model/linear.h"

namespace lily::cpu {

// How affine 4/8-bit products treat the activations: Int8 quantises them per block of 32 (fast, lossy:
// backend/cpu/affine_int8.h); Exact keeps them float (the reference the CUDA backend and the float
// golden comparisons are held to). Other formats and bit widths are unaffected.
enum class AffinePath { Int8, Exact };
// The process default: environment LILY_CPU_AFFINE=exact|int8, unset = int8 (read once; another value
// is an InputError naming the variable). set_affine_path_default overrides it for products and
// CpuBackends created afterwards (tests and tools; call it while no product runs).
AffinePath affine_path_default();
void set_affine_path_default(AffinePath p);

void matmul(const Linear& W, const float* x, int64_t T, float* y, AffinePath path);
inline void matmul(const Linear& W, const float* x, int64_t T, float* y) {
  matmul(W, x, T, y, affine_path_default());
}
void matmul_ref(const Linear& W, const float* x, int64_t T, float* y);

// Independent products y = x · Wᵀ. Affine 4/8-bit ones on the int8 path run in one parallel pass
// (affine_matmul_int8_batch: one hand-off to the threads, each distinct input quantised once); the
// others one after another. Results equal separate matmul calls.
struct MatJob {
  const Linear* W;
  const float* x;
  int64_t T;
  float* y;
};
void matmul_batch(std::span<const MatJob> jobs, AffinePath path);

// Row `row` of W dequantised to float32 (embedding gather).
void weight_row(const Linear& W, int64_t row, float* out);

// Format hooks for quantized weights (quant/*): same contracts as above.
void matmul_quantized(const Linear& W, const float* x, int64_t T, float* y, AffinePath path);
inline void matmul_quantized(const Linear& W, const float* x, int64_t T, float* y) {
  matmul_quantized(W, x, T, y, affine_path_default());
}
void matmul_quantized_ref(const Linear& W, const float* x, int64_t T, float* y);
void weight_row_quantized(const Linear& W, int64_t row, float* out);

}  // namespace lily::cpu
