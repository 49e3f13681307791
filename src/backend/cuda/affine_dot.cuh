// The affine decode products' inner loop, shared by the ring GEMV (gemv_ring.cu) and the step kernel
// (mk_kernel.cu): a staged input row in a bank-conflict-free column layout, and the dot product of one 16-byte
// column of MLX-affine codes with it without int->float conversions. A code c shifted into the mantissa of 1.0f
// gives f = 1 + c·2^-m exactly, so Σ c·x = 2^m·(Σ f·x − Σ x) with Σ x per column computed once (m = 4 for 4-bit
// codes, 8 for 8-bit). Per code: a shift, a mask-or, an FMA.
#pragma once
#include <cstdint>

namespace lily::cuda {

// Element e of the staged row: 16-byte column i = e / C holds elements [C·i, C·i + C); lanes reading
// columns i..i+31 read 512 contiguous bytes per float4.
template <int BITS>
__device__ __forceinline__ int xs_at(int e) {
  constexpr int C = 128 / BITS;
  const int i = e / C, j = e % C;
  return (i >> 5) * 32 * C + (j >> 2) * 128 + (i & 31) * 4 + (j & 3);
}

// 2^m·Σ f·x over one 16-byte column of codes (f = 1 + c·2^-m, see above); minus 2^m·Σ x it is Σ c·x.
template <int BITS>
__device__ __forceinline__ float col_dot(const uint4 w, const float (&xv)[128 / BITS]) {
  const uint32_t word[4] = {w.x, w.y, w.z, w.w};
  float a0 = 0.f, a1 = 0.f;
  if constexpr (BITS == 4) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int n = 0; n < 8; ++n) {  // nibble n (bits 4n..4n+3) -> bits 19..22
        const uint32_t t = n < 5 ? word[k] << (19 - 4 * n) : word[k] >> (4 * n - 19);
        const float f = __uint_as_float((t & 0x00780000u) | 0x3f800000u);
        if (n & 1) a1 = fmaf(f, xv[8 * k + n], a1);
        else a0 = fmaf(f, xv[8 * k + n], a0);
      }
    return 16.f * (a0 + a1);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // byte p (bits 8p..8p+7) -> bits 15..22
        const uint32_t t = p < 2 ? word[k] << (15 - 8 * p) : word[k] >> (8 * p - 15);
        const float f = __uint_as_float((t & 0x007f8000u) | 0x3f800000u);
        if (p & 1) a1 = fmaf(f, xv[4 * k + p], a1);
        else a0 = fmaf(f, xv[4 * k + p], a0);
      }
    return 256.f * (a0 + a1);
  }
}
// col_dot of RPW code columns against the same column of NX staged input rows, each code dequantised once for
// all rows (a shift and a mask-or per code, then one FMA per row): per (row r, column j) the sums run in col_dot's
// order, so out[r][j] equals col_dot(w[j], row r) bit for bit. x4[r]: the column's first float4 in row r's staged
// layout (xs_at: float4 q of the column at x4[r][32·q]); rows r >= nx are neither read nor written.
template <int BITS, int NX, int RPW>
__device__ __forceinline__ void col_dot_rows(const uint4 (&w)[RPW], const float4* const (&x4)[NX], int nx,
                                             float (&out)[NX][RPW]) {
  float a0[NX][RPW], a1[NX][RPW];
#pragma unroll
  for (int r = 0; r < NX; ++r)
#pragma unroll
    for (int j = 0; j < RPW; ++j) a0[r][j] = a1[r][j] = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    constexpr int CPW = 32 / BITS;  // codes per 32-bit word
    float xk[NX][CPW];
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      if (r >= nx) break;
#pragma unroll
      for (int q = 0; q < CPW / 4; ++q) {
        const float4 v = x4[r][32 * (k * CPW / 4 + q)];
        xk[r][4 * q] = v.x; xk[r][4 * q + 1] = v.y; xk[r][4 * q + 2] = v.z; xk[r][4 * q + 3] = v.w;
      }
    }
#pragma unroll
    for (int n = 0; n < CPW; ++n) {
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        const uint32_t word = k == 0 ? w[j].x : k == 1 ? w[j].y : k == 2 ? w[j].z : w[j].w;
        float f;
        if constexpr (BITS == 4) {
          const uint32_t t = n < 5 ? word << (19 - 4 * n) : word >> (4 * n - 19);
          f = __uint_as_float((t & 0x00780000u) | 0x3f800000u);
        } else {
          const uint32_t t = n < 2 ? word << (15 - 8 * n) : word >> (8 * n - 15);
          f = __uint_as_float((t & 0x007f8000u) | 0x3f800000u);
        }
#pragma unroll
        for (int r = 0; r < NX; ++r) {
          if (r >= nx) break;
          if (n & 1) a1[r][j] = fmaf(f, xk[r][n], a1[r][j]);
          else a0[r][j] = fmaf(f, xk[r][n], a0[r][j]);
        }
      }
    }
  }
  constexpr float m = BITS == 4 ? 16.f : 256.f;
#pragma unroll
  for (int r = 0; r < NX; ++r)
#pragma unroll
    for (int j = 0; j < RPW; ++j) out[r][j] = m * (a0[r][j] + a1[r][j]);
}

// 2^m: col_dot minus kColScale<BITS> · Σx of the column is Σ c·x.
template <int BITS>
constexpr float kColScale = BITS == 4 ? 16.f : 256.f;

}  // namespace lily::cuda
