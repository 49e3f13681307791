// CPU matrix products against Linear weights of any format, float32 activations.
//   y[T, out] = x[T, in] · Wᵀ
// matmul is threaded and vectorised; matmul_ref is the plain loop it is tested against.
#pragma once
#include <cstdint>

#include "model/linear.h"

namespace lily::cpu {

void matmul(const Linear& W, const float* x, int64_t T, float* y);
void matmul_ref(const Linear& W, const float* x, int64_t T, float* y);

// Row `row` of W dequantised to float32 (embedding gather).
void weight_row(const Linear& W, int64_t row, float* out);

// Format hooks for quantized weights (quant/*): same contracts as above.
void matmul_quantized(const Linear& W, const float* x, int64_t T, float* y);
void matmul_quantized_ref(const Linear& W, const float* x, int64_t T, float* y);
void weight_row_quantized(const Linear& W, int64_t row, float* out);

}  // namespace lily::cpu
