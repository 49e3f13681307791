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
         op == Operand::kBf16 ? "bf16" : op == Operand::kFp16 ? "fp16" : "split", W.name);
}

// kSplit: the hi part (round_op) and hi + lo (round_split, 16 significant bits, exact in fp32).
float round_op(Operand op, float v) { return op == Operand::kFp16 ? round_fp16(v) : round_bf16(v); }
float round_split(float v) {
  const float hi = round_bf16(v);
  return hi + round_bf16(v - hi);
}

// The rounded activations, fp16 rows scaled by 2^e (not undone: the outputs are, as on the device), and
// the per-row exponents (all 0 for bf16 and split). Split: hi + lo (whole = true) or hi alone.
std::vector<float> rounded_rows(Operand op, const float* x, int64_t T, int64_t K, std::vector<int>& e, bool whole = true) {
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
    for (int64_t k = 0; k < K; ++k)
      r[size_t(t * K + k)] = op == Operand::kSplit && whole ? round_split(xr[k]) : round_op(op, xr[k] * sc);
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

void matmul_reduced_operands(Operand op, const Linear& W, const float* x, int64_t T, float* y, int k_order) {
  if (T <= 0 || W.out == 0) return;
  refuse_exl3(op, W);
  const int64_t N = W.out, K = W.in;
  std::vector<int> e;
  std::vector<float> xr = rounded_rows(op, x, T, K, e);
  const bool bf16_weights = W.format == WeightFormat::Dense && W.dense.dtype == DType::BF16;
  if (op != Operand::kFp16 && bf16_weights && k_order == 0) {  // exact in bf16: w_lo = 0
    matmul(W, xr.data(), T, y, AffinePath::Exact);
    return;
  }
  // Blocks of output rows dequantised, rounded to the operand type and multiplied as a dense fp32 matrix
  // (its values are exact in fp32); split: plus x_hi · w_lo.
  const bool split = op == Operand::kSplit;
  std::vector<float> xh = split ? rounded_rows(op, x, T, K, e, false) : std::vector<float>();
  if (k_order < 0 || k_order > 2) throw InternalError("matmul_reduced_operands: k_order must be 0, 1 or 2");
  auto reorder_rows = [K, k_order](std::vector<float>& m, int64_t rows) {
    for (auto r = m.begin(); r != m.begin() + std::ptrdiff_t(rows * K); r += std::ptrdiff_t(K)) {
      if (k_order == 1) std::reverse(r, r + std::ptrdiff_t(K));
      else if (k_order == 2) std::rotate(r, r + std::ptrdiff_t(K / 2), r + std::ptrdiff_t(K));
    }
  };
  reorder_rows(xr, T);
  if (split) reorder_rows(xh, T);
  constexpr int64_t kBlock = 256;
  std::vector<float> wb(size_t(std::min(kBlock, N) * K)), wl(split ? wb.size() : 0);
  std::vector<float> yb(static_cast<size_t>(T * std::min(kBlock, N))), yl(split ? yb.size() : 0);
  for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const int64_t nb = std::min(kBlock, N - n0);
    for (int64_t r = 0; r < nb; ++r) {
      float* row = wb.data() + r * K;
      weight_row(W, n0 + r, row);
      for (int64_t k = 0; k < K; ++k) {
        const float v = row[k];
        row[k] = round_op(op, v);
        if (split) wl[size_t(r * K + k)] = round_bf16(v - row[k]);
      }
    }
    reorder_rows(wb, nb);
    if (split) reorder_rows(wl, nb);
    Linear v;
    v.name = W.name;
    v.out = nb;
    v.in = K;
    v.dense = {DType::F32, wb.data(), K};
    matmul(v, xr.data(), T, yb.data(), AffinePath::Exact);
    if (split) {
      v.dense = {DType::F32, wl.data(), K};
      matmul(v, xh.data(), T, yl.data(), AffinePath::Exact);
      for (size_t i = 0; i < size_t(T * nb); ++i) yb[i] += yl[i];
    }
    for (int64_t t = 0; t < T; ++t) std::copy_n(yb.data() + t * nb, nb, y + t * N + n0);
  }
  unscale_rows(e, N, y);
}

void matmul_reduced_operands_ref(Operand op, const Linear& W, const float* x, int64_t T, float* y) {
  refuse_exl3(op, W);
  std::vector<int> e;
  const std::vector<float> xr = rounded_rows(op, x, T, W.in, e), xh = rounded_rows(op, x, T, W.in, e, false);
  std::vector<float> row(size_t(W.in));
  for (int64_t n = 0; n < W.out; ++n) {
    weight_row(W, n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t k = 0; k < W.in; ++k) {
        const float w = row[size_t(k)], wh = round_op(op, w);
        s += double(xr[size_t(t * W.in + k)]) * double(wh);
        if (op == Operand::kSplit) s += double(xh[size_t(t * W.in + k)]) * double(round_bf16(w - wh));
      }
      y[t * W.out + n] = float(s * std::ldexp(1.0, -e[size_t(t)]));
    }
  }
}

}  // namespace lily::cpu
