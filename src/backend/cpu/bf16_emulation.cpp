#include "backend/cpu/bf16_emulation.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"

namespace lily::cpu {
namespace {

void refuse_exl3(const Linear& W) {
  if (W.format == WeightFormat::Exl3)
    fail("emulate_bf16: '{}' is EXL3 (its CUDA kernel stages inputs in fp16); the emulation covers dense and affine weights",
         W.name);
}

std::vector<float> rounded(const float* x, size_t n) {
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = round_bf16(x[i]);
  return r;
}

}  // namespace

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

void matmul_bf16_operands(const Linear& W, const float* x, int64_t T, float* y) {
  if (T <= 0 || W.out == 0) return;
  refuse_exl3(W);
  const int64_t N = W.out, K = W.in;
  const std::vector<float> xr = rounded(x, size_t(T * K));
  if (W.format == WeightFormat::Dense && W.dense.dtype == DType::BF16) {
    matmul(W, xr.data(), T, y, AffinePath::Exact);
    return;
  }
  // Blocks of output rows dequantised, rounded to bf16 and multiplied as a bf16 dense matrix.
  constexpr int64_t kBlock = 256;
  std::vector<uint16_t> wb(size_t(std::min(kBlock, N) * K));
  std::vector<float> row(static_cast<size_t>(K)), yb(static_cast<size_t>(T * std::min(kBlock, N)));
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t nb = std::min(kBlock, N - n0);
    for (int64_t r = 0; r < nb; ++r) {
      weight_row(W, n0 + r, row.data());
      for (int64_t k = 0; k < K; ++k) wb[size_t(r * K + k)] = f32_to_bf16(row[size_t(k)]);
    }
    Linear v;
    v.name = W.name;
    v.out = nb;
    v.in = K;
    v.dense = {DType::BF16, wb.data(), K};
    matmul(v, xr.data(), T, yb.data(), AffinePath::Exact);
    for (int64_t t = 0; t < T; ++t) std::copy_n(yb.data() + t * nb, nb, y + t * N + n0);
  }
}

void matmul_bf16_operands_ref(const Linear& W, const float* x, int64_t T, float* y) {
  refuse_exl3(W);
  std::vector<float> row(size_t(W.in));
  for (int64_t n = 0; n < W.out; ++n) {
    weight_row(W, n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < W.in; ++k) s += double(round_bf16(x[t * W.in + k])) * double(round_bf16(row[size_t(k)]));
      y[t * W.out + n] = float(s);
    }
  }
}

}  // namespace lily::cpu
