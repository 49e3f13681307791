// The activation side of the multi-row products (gemv_rows.cu), shared with their staging pass
// (rows_stage.cu): the same operations in the same order, so a staged product gives the bits of an
// unstaged one.
//
// A lane (g = lane / 4, c = lane % 4) of a 64-wide k chunk takes elements [16c, 16c + 16) of its
// activation row as X0, X1 (elements 8·half + 0..3, 8·half + 4..7) of each half. k16 step s = 2·half + sub
// feeds the MMA's B fragment with two bf16 pairs, hi and lo = bf16(x − hi): 4-bit weights as the element
// pairs (i, i + 4) of the half (the codes' nibble order), 8-bit and bf16 in element order.
//
// Staged layout (rows_stage.h): per x row `in` 32-bit words; word 64·ch + 16·c + 4·s + {0, 1, 2, 3} =
// {hi pair 0, hi pair 1, lo pair 0, lo pair 1} of chunk ch, lane c, step s; beside it Σx per chunk.
#pragma once
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"

namespace lily::cuda {

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// (v0, v1) -> bf16 pair hi (v0 in the low half) and the remainders lo = bf16(v - hi).
__device__ __forceinline__ void split_pair(float v0, float v1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  const float2 hf = __bfloat1622float2(h);
  hi = bf2_bits(h);
  lo = bf2_bits(__floats2bfloat162_rn(v0 - hf.x, v1 - hf.y));
}

// 1 / rms of an activation row (in % 128 == 0 not required; in % 4 == 0), one warp, every lane gets it.
__device__ __forceinline__ float rows_inv_rms(const float* row, int in, int lane, float eps) {
  float ss = 0.f;
  for (int i = 4 * lane; i < in; i += 128) {
    const float4 v = *reinterpret_cast<const float4*>(row + i);
    ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
  }
  ss = warp_sum(ss);
  return rsqrtf(ss / float(in) + eps);
}

// X0, X1 · iv · the norm weights of the same 8 elements (nw: 16-byte aligned).
__device__ __forceinline__ void rows_norm8(float4& X0, float4& X1, float iv, const float* nw) {
  const float4 w0 = __ldg(reinterpret_cast<const float4*>(nw)), w1 = __ldg(reinterpret_cast<const float4*>(nw + 4));
  X0 = make_float4(X0.x * iv * w0.x, X0.y * iv * w0.y, X0.z * iv * w0.z, X0.w * iv * w0.w);
  X1 = make_float4(X1.x * iv * w1.x, X1.y * iv * w1.y, X1.z * iv * w1.z, X1.w * iv * w1.w);
}

// Σ of the 8 elements of a half, in the order the fold's Σx takes them.
__device__ __forceinline__ float rows_sum8(const float4& X0, const float4& X1) {
  return ((X0.x + X0.y) + (X0.z + X0.w)) + ((X1.x + X1.y) + (X1.z + X1.w));
}

// The B fragment pairs of k16 step 2·half + sub from the half's elements (MODE 4: nibble order, else element order).
template <int MODE>
__device__ __forceinline__ void rows_bfrag(const float4& X0v, const float4& X1v, int sub, uint32_t (&bh)[2],
                                           uint32_t (&bl)[2]) {
  const float* X0 = reinterpret_cast<const float*>(&X0v);
  const float* X1 = reinterpret_cast<const float*>(&X1v);
  if constexpr (MODE == 4) {  // pairs (i, i + 4): elements (2·sub, 2·sub + 4), (2·sub + 1, 2·sub + 5)
    split_pair(X0[2 * sub], X1[2 * sub], bh[0], bl[0]);
    split_pair(X0[2 * sub + 1], X1[2 * sub + 1], bh[1], bl[1]);
  } else {  // element order: step s reads elements 4s .. 4s + 3
    const float* Xs = sub ? X1 : X0;
    split_pair(Xs[0], Xs[1], bh[0], bl[0]);
    split_pair(Xs[2], Xs[3], bh[1], bl[1]);
  }
}

}  // namespace lily::cuda
