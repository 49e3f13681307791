// Device pieces shared by the EXL3 kernels (exl3.cu: tile decode, GEMV; exl3_gemm.cu: GEMM): the trellis
// state decode of a warp's tile, non-caching loads, the part lookup, the warp Hadamard-128, the K / codebook
// dispatch and cluster launch configurations. Included by those two files only.
#pragma once
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/kernels.cuh"

namespace lily::cuda {

// Raise the kernels' shared-memory limits once per device (exl3.cu; init_exl3_kernels also calls the GEMM one).
void init_exl3_kernels();
void init_exl3_gemm_kernels();

namespace {

constexpr float kHad = 0.088388347648f;  // 1/sqrt(128) in fp32, as exllamav3

// The xor of the 3INST and MCG codebooks, from constant memory: the compiler cannot fold it into an immediate,
// so (x & 0x8FFF8FFF) ^ it is one LOP3 a weight (with two immediates ptxas emits two).
__constant__ uint32_t kTrellisXor = 0x3B603B60u;

// 3INST / MCG: the masked hash of a state, whose two fp16 halves sum to the weight (decode_state).
template <int CB>
__device__ __forceinline__ uint32_t state_hash(uint32_t s) {
  const uint32_t h = CB == 0 ? s * 89226354u + 64248484u : s * 0xCBAC1FEDu;
  uint32_t x;
  asm("lop3.b32 %0, %1, 0x8FFF8FFF, %2, 0x6A;" : "=r"(x) : "r"(h), "r"(kTrellisXor));  // (a & b) ^ c
  return x;
}

// 16-bit state -> fp16 through codebook CB (0 3INST, 1 MCG, 2 MUL1); one fp16 rounding, as exllamav3.
template <int CB>
__device__ __forceinline__ __half decode_state(uint32_t s) {
  if constexpr (CB == 2) {
    const uint32_t x = s * 0x83DCD12Du;
    const uint32_t n = __dp4a(x, 0x01010101u, 0u);  // byte sum, 0..1020
    const __half hv = __ushort_as_half(uint16_t(0x6400u + n));  // exactly 1024 + n
    return __hfma(hv, __ushort_as_half(uint16_t(0x1EEE)), __ushort_as_half(uint16_t(0xC931)));
  } else {
    const uint32_t x = state_hash<CB>(s);
    return __hadd(__ushort_as_half(uint16_t(x & 0xFFFFu)), __ushort_as_half(uint16_t(x >> 16)));
  }
}

// States of stream positions 8L..8L+7 of one tile whose 8K little-endian uint32 words (the stored uint16
// pairs) are at w. The 16-bit window of position t ends at stream bit (t+1)K (cyclic); the 7K + 16 bits
// lane L needs always fit in 3 consecutive words (cyclic).
template <int K>
__device__ __forceinline__ void lane_states(const uint32_t* w, int L, uint32_t st[8]) {
  constexpr int NW = 8 * K;
  const int A = 8 * L * K + K - 16 + 256 * K;  // start of position 8L's window, kept positive
  const int qa = (A >> 5) % NW, off = A & 31;
  const uint32_t w0 = w[qa], w1 = w[(qa + 1) % NW], w2 = w[(qa + 2) % NW];
  const uint64_t hi = (uint64_t(w0) << 32) | w1, lo = (uint64_t(w1) << 32) | w2;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int e = off + 16 + u * K;  // window end, counted from the most significant bit of w0
    st[u] = (e <= 64 ? uint32_t(hi >> (64 - e)) : uint32_t(lo >> (96 - e))) & 0xFFFFu;
  }
}

template <int K, int CB>
__device__ __forceinline__ void lane_decode(const uint32_t* w, int L, __half v[8]) {
  uint32_t st[8];
  lane_states<K>(w, L, st);
  if constexpr (CB == 2) {
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = decode_state<CB>(st[u]);
  } else {
    // two weights a step: their low halves and their high halves gathered by one PRMT each, one HADD2
    // (the same sums as decode_state's, lane by lane)
#pragma unroll
    for (int u = 0; u < 8; u += 2) {
      const uint32_t a = state_hash<CB>(st[u]), b = state_hash<CB>(st[u + 1]);
      const uint32_t lo = __byte_perm(a, b, 0x5410), hi = __byte_perm(a, b, 0x7632);
      uint32_t sum;
      asm("add.rn.f16x2 %0, %1, %2;" : "=r"(sum) : "r"(lo), "r"(hi));
      v[u] = __ushort_as_half(uint16_t(sum & 0xFFFFu));
      v[u + 1] = __ushort_as_half(uint16_t(sum >> 16));
    }
  }
}

__device__ __forceinline__ uint4 ld_nc4(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_nc2(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Part and 128-column block of blockIdx.x among one expert's parts.
__device__ __forceinline__ const Exl3Part* locate(const Exl3Part* ep, int& nb) {
  int p = 0;
  while (nb >= ep[p].out_p / 128) nb -= ep[p++].out_p / 128;
  return ep + p;
}

// In-place fp32 FWHT of the 128 values a warp holds as v[0..3] = elements 4·lane .. 4·lane + 3 (unscaled).
__device__ __forceinline__ void warp_had128(float v[4], int lane) {
  const float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
  v[0] = a + c; v[1] = b + d; v[2] = a - c; v[3] = b - d;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float o = __shfl_xor_sync(0xffffffffu, v[q], m);
      v[q] = (lane & m) ? o - v[q] : v[q] + o;
    }
}

// Calls f(integral_constant<K>, integral_constant<CB>) for runtime K in 1..8 and CB in 0..2.
template <typename F>
void dispatch(int K, int cb, F&& f) {
  auto with_cb = [&](auto kc) {
    switch (cb) {
      case 0: f(kc, std::integral_constant<int, 0>{}); return;
      case 1: f(kc, std::integral_constant<int, 1>{}); return;
      case 2: f(kc, std::integral_constant<int, 2>{}); return;
      default: fail_internal("EXL3: codebook must be 0 (3inst), 1 (mcg) or 2 (mul1)");
    }
  };
  switch (K) {
    case 1: with_cb(std::integral_constant<int, 1>{}); return;
    case 2: with_cb(std::integral_constant<int, 2>{}); return;
    case 3: with_cb(std::integral_constant<int, 3>{}); return;
    case 4: with_cb(std::integral_constant<int, 4>{}); return;
    case 5: with_cb(std::integral_constant<int, 5>{}); return;
    case 6: with_cb(std::integral_constant<int, 6>{}); return;
    case 7: with_cb(std::integral_constant<int, 7>{}); return;
    case 8: with_cb(std::integral_constant<int, 8>{}); return;
    default: fail_internal("EXL3: K must be 1..8");
  }
}

// A launch of grid blocks of `threads` in clusters of ks along x (no cluster attribute when ks = 1); the
// attribute lives in attr, which must outlive the launch.
cudaLaunchConfig_t cluster_launch(dim3 grid, int threads, size_t smem, cudaStream_t s, int ks, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(ks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = ks > 1 ? 1 : 0;
  return cfg;
}

}  // namespace
}  // namespace lily::cuda
