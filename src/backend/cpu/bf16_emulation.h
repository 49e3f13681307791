// Emulation of the CUDA backend's bf16-operand prompt GEMMs (backend/cuda/switches.h, GemmPrec::kBf16), for
// measuring on the CPU what a choice of bf16 product classes does to the logits (CpuOptions::emulate_bf16):
//   y[T, out] = bf16(x) · bf16(W)ᵀ, fp32 accumulation,
// both operands rounded to bf16 nearest-even (as __float2bfloat16_rn). bf16 dense weights are exact already;
// F32/F16 dense and affine weights (dequantised s·q + b in fp32, as the CUDA GEMM stages them) are rounded
// element by element. A product of two bf16 values is exact in fp32, so matmul's fp32 FMA chain is the tensor
// cores' arithmetic up to the order of the additions. EXL3 weights are refused (InputError naming the
// tensor): CUDA stages their inputs in fp16 inside the format's own kernel.
#pragma once
#include <cstdint>

#include "model/linear.h"

namespace lily::cpu {

float round_bf16(float v);

void matmul_bf16_operands(const Linear& W, const float* x, int64_t T, float* y);
// Plain reference: double sums of the rounded operands, one output at a time.
void matmul_bf16_operands_ref(const Linear& W, const float* x, int64_t T, float* y);

}  // namespace lily::cpu
