// The per-row power-of-two scale of the fp16-operand prompt GEMMs (CUDA GemmPrec::kFp16 and the CPU's emulation
// of it, backend/cpu/operand_emulation.h), one rule for both. A row x of activations is multiplied by 2^e before
// its fp16 rounding and the row's outputs by 2^-e after the fp32 accumulation (both exact in fp32), e chosen
// from m = max|x| so that the row's largest magnitude lands in [2^14, 2^15): below fp16's 65,504 after rounding
// and 2^28 above its subnormal range. m zero, subnormal-small, inf or NaN: e = 0, or e clamped to ±126 so
// that 2^e and 2^-e are normal floats (a row holding NaN keeps its NaN; one holding inf overflows as in fp32).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LILY_HD __host__ __device__ __forceinline__
#else
#define LILY_HD inline
#endif

namespace lily {

constexpr int kFp16RowTop = 14;  // the scaled row maximum lies in [2^14, 2^15)

// e for a row whose largest magnitude is m (m >= 0, as fmaxf of |x| gives: NaN elements do not count).
LILY_HD int fp16_row_exponent(float m) {
  uint32_t u;
  std::memcpy(&u, &m, 4);
  const int be = int((u >> 23) & 255u);
  if ((u & 0x7fffffffu) == 0 || be == 255) return 0;
  const int e = kFp16RowTop - (be == 0 ? -127 : be - 127);
  return e < -126 ? -126 : e > 126 ? 126 : e;
}

// 2^e as a float, for -126 <= e <= 127.
LILY_HD float pow2f(int e) {
  const uint32_t u = uint32_t(127 + e) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace lily
