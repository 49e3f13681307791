#include "backend/cpu/operand_emulation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/fp16_scale.h"
#include "core/error.h"
#include "core/half.h"

namespace lily::cpu {
namespace {

void refuse_exl3(Operand op, const Linear& W) {
  if (W.format == WeightFormat::Exl3)
    fail("emulate_{}: '{}' is EXL3 (its CUDA kernel stages inputs itself); the emulation covers dense and affine weights",
         op == Operand::kBf16 ? "bf16" : "fp16", W.name);
}

float round_op(Operand op, float v) { return op == Operand::kBf16 ? round_bf16(v) : round_fp16(v); }

// The rounded activations, fp16 rows scaled by 2^e (not undone: the outputs are, as on the device), and
// the per-row exponents (all 0 for bf16).
std::vector<float> rounded_rows(Operand op, const float* x, int64_t T, int64_t K, std::vector<int>& e) {
  std::vector<float> r(size_t(T * K));
  e.assign(size_t(T), 0);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * K;
    float sc = 1.0f;
    if (op == Operand::kFp16) {
      float m = 0.0f;
      for (int64_t k = 0; k < K; ++k) m = std::fmax(m, std::fabs(xr[k]));
      e[size_t(t)] = fp16_row_exponent(m);
      sc = pow2f(e[size_t(t)]);
    }
    for (int64_t k = 0; k < K; ++k) r[size_t(t * K + k)] = round_op(op, xr[k] * sc);
  }
  return r;
}

void unscale_rows(const std::vector<int>& e, int64_t N, float* y) {
  for (size_t t = 0; t < e.size(); ++t)
    if (e[t] != 0) {
      const float inv = pow2f(-e[t]);
      for (int64_t n = 0; n < N; ++n) y[int64_t(t) * N + n] *= inv;
    }
}

}  // namespace

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
float round_fp16(float v) { return f16_to_f32(f32_to_f16(v)); }

void matmul_reduced_operands(Operand op, const Linear& W, const float* x, int64_t T, float* y) {
  if (T <= 0 || W.out == 0) return;
  refuse_exl3(op, W);
  const int64_t N = W.out, K = W.in;
  std::vector<int> e;
  const std::vector<float> xr = rounded_rows(op, x, T, K, e);
  if (op == Operand::kBf16 && W.format == WeightFormat::Dense && W.dense.dtype == DType::BF16) {
    matmul(W, xr.data(), T, y, AffinePath::Exact);
    return;
  }
  // Blocks of output rows dequantised, rounded to the operand type and multiplied as a dense fp32 matrix
  // (its values are exact in fp32).
  constexpr int64_t kBlock = 256;
  std::vector<float> wb(size_t(std::min(kBlock, N) * K));
  std::vector<float> yb(static_cast<size_t>(T * std::min(kBlock, N)));
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t nb = std::min(kBlock, N - n0);
    for (int64_t r = 0; r < nb; ++r) {
      float* row = wb.data() + r * K;
      weight_row(W, n0 + r, row);
      for (int64_t k = 0; k < K; ++k) row[k] = round_op(op, row[k]);
    }
    Linear v;
    v.name = W.name;
    v.out = nb;
    v.in = K;
    v.dense = {DType::F32, wb.data(), K};
    matmul(v, xr.data(), T, yb.data(), AffinePath::Exact);
    for (int64_t t = 0; t < T; ++t) std::copy_n(yb.data() + t * nb, nb, y + t * N + n0);
  }
  unscale_rows(e, N, y);
}

void matmul_reduced_operands_ref(Operand op, const Linear& W, const float* x, int64_t T, float* y) {
  refuse_exl3(op, W);
  std::vector<int> e;
  const std::vector<float> xr = rounded_rows(op, x, T, W.in, e);
  std::vector<float> row(size_t(W.in));
  for (int64_t n = 0; n < W.out; ++n) {
    weight_row(W, n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < W.in; ++k) s += double(xr[size_t(t * W.in + k)]) * double(round_op(op, row[size_t(k)]));
      y[t * W.out + n] = float(s * std::ldexp(1.0, -e[size_t(t)]));
    }
  }
}

}  // namespace lily::cpu
