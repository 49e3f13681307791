#include "backend/cpu/matmul.h"
#include "core/error.h"

namespace lily::cpu {

void matmul_quantized(const Linear& W, const float*, int64_t, float*) {
  fail("{}: {} weights are not supported by the CPU backend in this build", W.name, format_name(W.format));
}
void matmul_quantized_ref(const Linear& W, const float* x, int64_t T, float* y) { matmul_quantized(W, x, T, y); }
void weight_row_quantized(const Linear& W, int64_t, float*) {
  fail("{}: {} weights are not supported by the CPU backend in this build", W.name, format_name(W.format));
}

}  // namespace lily::cpu
