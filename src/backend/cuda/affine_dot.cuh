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
// 2^m: col_dot minus kColScale<BITS> · Σx of the column is Σ c·x.
template <int BITS>
constexpr float kColScale = BITS == 4 ? 16.f : 256.f;

}  // namespace lily::cuda
