// Emulation of the CUDA backend's reduced-operand prompt GEMMs (backend/cuda/switches.h, GemmPrec), for
// measuring on the CPU what a choice of product classes in bf16 or fp16 does to the logits
// (CpuOptions::emulate_bf16 / emulate_fp16). Both: y[T, out] = r(x) · r(W)ᵀ with fp32 accumulation, where
//   bf16: r rounds to bf16 nearest-even (as __float2bfloat16_rn);
//   fp16: r rounds to fp16 nearest-even (as __float2half_rn, subnormals kept, above 65,504 inf); each input row
//         is multiplied by its power of two 2^e (backend/fp16_scale.h) before the rounding and its outputs by
//         2^-e after the accumulation, as the CUDA kernel does.
// and the split mode (GemmPrec::kSplit, `--precision high`): x = x_hi + x_lo and W = w_hi + w_lo in bf16 (each lo
// the bf16 rounding of what hi leaves), y = (x_hi + x_lo) · w_hi + x_hi · w_lo (bf16 weights: w_lo = 0).
// Dense weights exact in the operand type stay as they are; F32/F16 dense and affine weights (dequantised s·q + b
// in fp32, as the CUDA GEMM stages them) are rounded element by element. A product of two bf16 (or two fp16)
// values is exact in fp32, so matmul's fp32 FMA chain is the tensor cores' arithmetic up to the order of the
// additions. EXL3 weights are refused (InputError naming the tensor): CUDA stages their inputs inside the
// format's own kernel (its split mode is fp32-class: the CPU backend runs them in float32).
#pragma once
#include <cstdint>

#include "model/linear.h"

namespace lily::cpu {

enum class Operand { kBf16, kFp16, kSplit };

float round_bf16(float v);
float round_fp16(float v);

// k_order: the fp32 sums run over k in order (0), in the reverse order (1) or from k = in/2 round to in/2 - 1 (2),
// every operand rounded as before: what a change of summation order alone does to a model's logits
// (CpuOptions::emulate_k_order).
void matmul_reduced_operands(Operand op, const Linear& W, const float* x, int64_t T, float* y, int k_order = 0);
// Plain reference: double sums of the rounded (and, fp16, scaled) operands, one output at a time.
void matmul_reduced_operands_ref(Operand op, const Linear& W, const float* x, int64_t T, float* y);

inline void matmul_bf16_operands(const Linear& W, const float* x, int64_t T, float* y) {
  matmul_reduced_operands(Operand::kBf16, W, x, T, y);
}
inline void matmul_bf16_operands_ref(const Linear& W, const float* x, int64_t T, float* y) {
  matmul_reduced_operands_ref(Operand::kBf16, W, x, T, y);
}

}  // namespace lily::cpu
