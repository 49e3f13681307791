// EXL3 (trellis-coded) weights on the device, see shared/docs/exl3-format.md and quant/exl3/exl3.h.
//   - tile decode: a warp decodes one 16x16 tile, lane L the stream positions 8L..8L+7, which are
//     exactly the B fragments of two mma.m16n8k16 (k rows 2(L%4)+{0,1,8,9}, n columns L/4 and L/4+8).
//   - GEMV (decode rows, MoE slots): one block per (slot, 128-column block of a part), or a thread-block
//     cluster of ks blocks (sm_90) that split its k-tile rows when the grid would leave SMs idle. The input
//     row (optionally RMS-normalised) ⊙ suh goes through the Hadamard-128 in shared memory; every warp walks
//     k-tile rows, streams the packed words of 8 tiles (one row of the 128-column block) into a per-warp
//     buffer and decodes them in registers against the staged input; the block then reduces (rank 0 of a
//     cluster adds the other ranks' sums from their shared memory, in rank order), applies the output
//     Hadamard-128, svh, bias and the logical column map (or silu(gate)·up in swiglu mode).
//   - GEMM (prompts, MoE tile map): one block per (tile of <= 64 rows, 128-column block). Per 128-wide k
//     chunk the rows are staged in fp16 after suh and the Hadamard, each row times its power of two (the rule
//     of backend/fp16_scale.h on max |x|, from gemm_stage.h's pre-pass) and 2^-8 of headroom for the
//     Hadamard's growth, undone on the outputs, so that no row overflows fp16 or sinks into its subnormals
//     (GemmPrec::kSplit: as hi + lo pairs, two MMAs per product, so it keeps fp32-like accuracy; kBf16 and
//     kFp16: hi alone); the chunk's trellis words are staged in shared memory, each warp decodes its tile
//     column straight into B fragments and runs mma.sync m16n8k16 with fp32 accumulation. Dense products of
//     few rows (exl3_rows, always split) split the k chunks over a thread-block cluster of ks blocks along x
//     (sm_90) and take the row scales from max |x| over the cluster (no pre-pass); rank 0 sums the partial
//     tiles from the others' shared memory in rank order and finishes.
// Weights are never dequantised to global memory.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/device_info.h"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/rows.h"

namespace lily::cuda {
namespace {

constexpr float kHad = 0.088388347648f;  // 1/sqrt(128) in fp32, as exllamav3
constexpr int kGvWarps = 16;             // GEMV warps per block
constexpr int kGmRows = kGemmBM;         // GEMM rows per tile (the MoE tile map's granularity)
constexpr int kAStride = 136;            // halves per staged GEMM input row (conflict-free fragment loads)
constexpr int kCStride = 132;            // floats per staged GEMM output row

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

// Partial sums [unit][rank][P·128] and one arrival counter per unit (column block and slot), zero between launches.
struct SplitScratch {
  float* part = nullptr;
  unsigned* count = nullptr;
};
constexpr int kSplitPerSmMax = 4;  // KernelSwitches::exl3_gemv_split's upper bound: blocks of a split launch per SM

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

// ---- tile decode (tests) ----------------------------------------------------------------------
template <int K, int CB>
__global__ void decode_tiles_kernel(const uint16_t* __restrict__ trellis, int out_p, uint16_t* __restrict__ w_hat) {
  __shared__ uint32_t tw[8 * K];
  const int j = blockIdx.x, i = blockIdx.y, L = threadIdx.x, tn = out_p / 16;
  const uint32_t* src = reinterpret_cast<const uint32_t*>(trellis + (int64_t(i) * tn + j) * 16 * K);
  for (int q = L; q < 8 * K; q += 32) tw[q] = src[q];
  __syncwarp();
  __half v[8];
  lane_decode<K, CB>(tw, L, v);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int r = 2 * (L & 3) + ((u & 3) < 2 ? (u & 1) : 8 + (u & 1)), c = (L >> 2) + (u >= 4 ? 8 : 0);
    w_hat[int64_t(16 * i + r) * out_p + 16 * j + c] = __half_as_ushort(v[u]);
  }
}

// ---- GEMV ------------------------------------------------------------------------------------
// P = 1: block x / ks = column block among the expert's parts. P = 2 (swiglu): parts 0 (gate) and 1 (up) of
// the expert, block x / ks = column block of both; output r = silu(gate_r) · up_r for r < swiglu_I.
// ks > 1: block x % ks takes the k-tile rows ≡ its rank (mod ks) in steps of kGvWarps rows. Launched as
// clusters of ks along x (fx empty): rank 0 adds the ranks' sums and finishes; as independent blocks (fx set):
// the last block of the column block to arrive adds them (in rank order too) and finishes. K <= 4: registers capped for two blocks per SM (the split's
// grids count on them).
template <int K, int CB, int P>
__global__ void __launch_bounds__(32 * kGvWarps, K <= 4 ? 2 : 1) exl3_gemv_kernel(const Exl3Part* __restrict__ parts, int nparts,
    const int32_t* __restrict__ expert, int out, int in, const float* __restrict__ x, int64_t ldx, int xdiv,
    float* __restrict__ y, int64_t ldy, bool accumulate, int swiglu_I, const float* __restrict__ norm_w, float eps,
    int ks, SplitScratch fx) {
  extern __shared__ __align__(16) float smem[];
  __shared__ float rsum[32];
  __shared__ float ov[P * 128];
  __shared__ int fix_last;
  const int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // PDL: the next kernel may be scheduled now; this one waits for the previous kernel before it reads what that
  // kernel writes (expert ids, activations, y) and before any global write
  allow_dependent_launch();
  if (expert) grid_dependency_wait();
  const int e = expert ? expert[slot] : 0;
  const Exl3Part* ep = parts + int64_t(e) * nparts;
  int nb = blockIdx.x / ks;
  const int kr = blockIdx.x % ks, kstep = kGvWarps * ks;
  const Exl3Part* pt = P == 1 ? locate(ep, nb) : ep;
  const int in_p = pt->in_p;
  float* xh = smem;                                                    // [P][in_p]
  float* red = xh + P * in_p;                                          // [kGvWarps][P][128]
  uint32_t* tw = reinterpret_cast<uint32_t*>(red + kGvWarps * P * 128) + warp * 64 * K;  // 8 tiles per warp
  const float* xr = x + int64_t(slot / xdiv) * ldx;
  const int TK = in_p / 16, rq = 2 * (lane & 3), i0 = warp + kGvWarps * kr;
  auto part_base = [&](int p) { return reinterpret_cast<const uint2*>(pt[p].trellis + int64_t(nb) * 8 * 16 * K); };
  auto part_row = [&](int p) { return int64_t(pt[p].out_p / 16) * 4 * K; };  // uint2 per k-tile row of the matrix
  uint2 cur[K];  // the packed words of this warp's next k-tile row: the first in flight during the staging
  if (i0 < TK)
#pragma unroll
    for (int m = 0; m < K; ++m) cur[m] = ld_nc2(part_base(0) + i0 * part_row(0) + lane + 32 * m);
  if (!expert) grid_dependency_wait();  // dense: the first weights are in flight while the previous kernel ends
  float inv = 1.f;
  if (norm_w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < in; i += blockDim.x) ss += xr[i] * xr[i];
    inv = rsqrtf(block_sum(ss, rsum) / float(in) + eps);
  }
  // This rank's k-tile rows i ≡ warp + kGvWarps·kr (mod kstep) read the inputs of the 256-wide pairs of
  // 128-chunks q ≡ kr (mod ks) (the last pair may be half): only those are staged.
  static_assert(kGvWarps * 16 == 256, "one k-tile row per warp covers a pair of 128-chunks");
  const int npair = (in_p + 255) / 256, mine = (npair - kr + ks - 1) / ks;
  for (int t = threadIdx.x; t < mine * 256; t += blockDim.x) {
    const int k = (kr + ks * (t >> 8)) * 256 + (t & 255);
    if (k >= in_p) continue;
    const float v = k < in ? (norm_w ? xr[k] * inv * norm_w[k] : xr[k]) : 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) xh[p * in_p + k] = v * __half2float(__ushort_as_half(pt[p].suh[k]));
  }
  __syncthreads();
  for (int h = 1; h < 128; h <<= 1) {
#pragma unroll
    for (int p = 0; p < P; ++p)
      for (int r = threadIdx.x; r < mine * 128; r += blockDim.x) {
        const int b = r & 127, lo = (kr + ks * (r >> 7)) * 256 + (b / h) * 2 * h + (b % h);
        if (lo >= in_p) continue;
        float* xp = xh + p * in_p;
        const float a = xp[lo], c = xp[lo + h];
        xp[lo] = a + c;
        xp[lo + h] = a - c;
      }
    __syncthreads();
  }
  // one part at a time: its sums go to red before the next part starts (half the live accumulators at P = 2)
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float acc[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) acc[j][h] = 0.f;
    const uint2* base = part_base(p);
    const int64_t row_u2 = part_row(p);
    const float* xp = xh + p * in_p;
    if (p > 0 && i0 < TK)
#pragma unroll
      for (int m = 0; m < K; ++m) cur[m] = ld_nc2(base + i0 * row_u2 + lane + 32 * m);
    for (int i = i0; i < TK; i += kstep) {
      __syncwarp();
#pragma unroll
      for (int m = 0; m < K; ++m) reinterpret_cast<uint2*>(tw)[lane + 32 * m] = cur[m];
      __syncwarp();
      if (i + kstep < TK)  // next row in flight while this one decodes
#pragma unroll
        for (int m = 0; m < K; ++m) cur[m] = ld_nc2(base + (i + kstep) * row_u2 + lane + 32 * m);
      const float x0 = xp[16 * i + rq], x1 = xp[16 * i + rq + 1], x8 = xp[16 * i + rq + 8], x9 = xp[16 * i + rq + 9];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        __half v[8];
        lane_decode<K, CB>(tw + j * 8 * K, lane, v);
        float w[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) w[u] = __half2float(v[u]);
        acc[j][0] += x0 * w[0] + x1 * w[1] + x8 * w[2] + x9 * w[3];
        acc[j][1] += x0 * w[4] + x1 * w[5] + x8 * w[6] + x9 * w[7];
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = acc[j][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if ((lane & 3) == 0) red[(warp * P + p) * 128 + j * 16 + (lane >> 2) + 8 * h] = v;
      }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < P * 128; t += blockDim.x) {
    const int p = t >> 7, c = t & 127;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kGvWarps; ++w) s += red[(w * P + p) * 128 + c];
    ov[t] = s;
  }
  __syncthreads();
  if (ks > 1 && fx.part) {
    // Independent blocks: each writes its sums to its rank's row of the column block's partials; the last to
    // arrive (counted in fx.count) adds the rows in rank order, resets the counter for the next launch on this
    // stream (launches on one stream run one after the other) and finishes.
    const int unit = blockIdx.y * (gridDim.x / ks) + blockIdx.x / ks;
    float* part = fx.part + int64_t(unit) * ks * P * 128;
    for (int t = threadIdx.x; t < P * 128; t += blockDim.x) __stcg(part + kr * P * 128 + t, ov[t]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      fix_last = atomicAdd(fx.count + unit, 1u) == unsigned(ks - 1);
      if (fix_last) fx.count[unit] = 0u;
    }
    __syncthreads();
    if (!fix_last) return;
    __threadfence();
    for (int t = threadIdx.x; t < P * 128; t += blockDim.x) {
      float v = __ldcg(part + t);
      for (int r = 1; r < ks; ++r) v += __ldcg(part + r * P * 128 + t);
      ov[t] = v;
    }
    __syncthreads();
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ks > 1 && !fx.part) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();  // every rank's sums are in its ov
    const bool lead = cl.block_rank() == 0;
    if (lead)
      for (int t = threadIdx.x; t < P * 128; t += blockDim.x) {
        float s = ov[t];
        for (int r = 1; r < ks; ++r) s += cl.map_shared_rank(ov, r)[t];
        ov[t] = s;
      }
    cl.sync();  // the other ranks' shared memory stays alive until rank 0 has read it
    if (!lead) return;
  }
#endif
  for (int h = 1; h < 128; h <<= 1) {
    for (int q = threadIdx.x; q < P * 64; q += blockDim.x) {
      const int lo = (q / h) * 2 * h + (q % h);
      const float a = ov[lo], b = ov[lo + h];
      ov[lo] = a + b;
      ov[lo + h] = a - b;
    }
    __syncthreads();
  }
  const float sc = kHad * kHad;
  auto value = [&](const Exl3Part& q, int p, int col) {  // padded column col of part q (slot p of ov)
    float v = ov[p * 128 + (col & 127)] * sc * __half2float(__ushort_as_half(q.svh[col]));
    if (q.bias) v += __half2float(__ushort_as_half(q.bias[col]));
    return v;
  };
  float* yr = y + int64_t(slot) * ldy;
  if constexpr (P == 2) {
    const int t = threadIdx.x, r = nb * 128 + t;
    if (t < 128 && r < swiglu_I) {
      const float v = silu(value(pt[0], 0, r)) * value(pt[1], 1, r);
      yr[r] = accumulate ? yr[r] + v : v;
    }
  } else {
    if (!pt->out_rows) {
      const int t = threadIdx.x, j = nb * 128 + t;
      if (t < 128 && j < pt->rows && pt->row0 + j < out) {
        const float v = value(*pt, 0, j);
        float* yp = yr + pt->row0 + j;
        *yp = accumulate ? *yp + v : v;
      }
    } else {
      for (int j = threadIdx.x; j < pt->rows && pt->row0 + j < out; j += blockDim.x) {
        const int col = pt->out_rows[j];
        if ((col >> 7) != nb) continue;
        const float v = value(*pt, 0, col);
        float* yp = yr + pt->row0 + j;
        *yp = accumulate ? *yp + v : v;
      }
    }
  }
}

// ---- GEMM ------------------------------------------------------------------------------------
// The row scales' headroom: a Hadamard-128 row (· 1/sqrt(128)) of x ⊙ suh can grow to sqrt(128) · max|x ⊙ suh|;
// row scales put max|x| in [2^14, 2^15), this factor brings it to [2^6, 2^7): no overflow while |suh| < 45.
constexpr float kExl3Headroom = 1.f / 256.f;
__device__ __forceinline__ uint32_t pack2(__half lo, __half hi) {
  return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}

template <int K>
constexpr size_t gemm_smem() {
  return size_t(2) * kGmRows * kAStride * 2 + size_t(64) * 8 * K * 4;
}

// 256 threads = 8 warps; warp w owns tile column w of the 128-column block (16 outputs, 2 n8 fragments)
// for all 64 rows (4 m16 fragments). ks > 1 (launched as clusters of ks along x): block x = column block · ks
// + cluster rank, which takes the k chunks ≡ rank (mod ks). SPLIT: the input rows as fp16 hi + lo (two
// MMAs), else hi alone. Row scales: rs.s (a pre-pass), or with rs.s null max |x| of each row over the
// cluster's k chunks (dense rows: exl3_rows).
template <int K, int CB, bool SPLIT>
__global__ void __launch_bounds__(256) exl3_gemm_kernel(const Exl3Part* __restrict__ parts, int nparts, int out, int in,
    const float* __restrict__ x, int64_t ldx, const int32_t* __restrict__ gather, float* __restrict__ y, int64_t ldy,
    bool accumulate, const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles, int T, int ks,
    const RowScales rs) {
  extern __shared__ __align__(16) unsigned char sm[];
  __half* Ahi = reinterpret_cast<__half*>(sm);                               // [64][kAStride]
  __half* Alo = Ahi + kGmRows * kAStride;                                    // [64][kAStride]
  uint32_t* tw = reinterpret_cast<uint32_t*>(Alo + kGmRows * kAStride);      // chunk tile (ii, j) at (8ii + j)·8K
  float* Cs = reinterpret_cast<float*>(sm);                                  // [64][kCStride], after the k loop
  __shared__ int rows_idx[kGmRows];
  __shared__ float rows_scale[kGmRows];
  __shared__ float rows_max[kGmRows];  // without rs.s: max |x| of each row over this block's k chunks
  const int tile = blockIdx.y;
  int e = 0, row0, nrows;
  if (tiles) {
    if (tile >= *n_tiles) return;
    e = tiles[3 * tile]; row0 = tiles[3 * tile + 1]; nrows = tiles[3 * tile + 2];
  } else {
    row0 = tile * kGmRows; nrows = min(kGmRows, T - row0);
  }
  int nb = blockIdx.x / ks;
  const int kr = blockIdx.x % ks;
  const Exl3Part* pt = locate(parts + int64_t(e) * nparts, nb);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
  if (tid < kGmRows) {
    const int src = tid < nrows ? (gather ? gather[row0 + tid] : row0 + tid) : -1;
    rows_idx[tid] = src;
    rows_scale[tid] = rs.s && src >= 0 ? row_scale_of(rs, src, row0 + tid) * kExl3Headroom : 1.f;
  }
  __syncthreads();
  const int in_p = pt->in_p, tn = pt->out_p / 16;
  if (!rs.s) {  // the scales from the rows themselves, the same in every block of a cluster
    for (int r = warp; r < nrows; r += 8) {
      const float* xr = x + int64_t(rows_idx[r]) * ldx;
      float m = 0.f;
      for (int kb = kr; kb < in_p / 128; kb += ks)
        for (int k = kb * 128 + lane; k < min(in, kb * 128 + 128); k += 32) m = fmaxf(m, fabsf(xr[k]));
      m = warp_max(m);
      if (lane == 0) rows_max[r] = m;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (ks > 1) {
      namespace cg = cooperative_groups;
      cg::cluster_group cl = cg::this_cluster();
      cl.sync();  // every rank's maxima written; they stay alive until the cluster's last sync below
      if (tid < nrows) {
        float m = 0.f;
        for (int q = 0; q < ks; ++q) m = fmaxf(m, cl.map_shared_rank(rows_max, q)[tid]);
        rows_scale[tid] = pow2f(fp16_row_exponent(m)) * kExl3Headroom;
      }
    } else
#endif
    {
      __syncthreads();
      if (tid < nrows) rows_scale[tid] = pow2f(fp16_row_exponent(rows_max[tid])) * kExl3Headroom;
    }
    __syncthreads();
  }
  const int mtiles = (nrows + 15) / 16;
  float acc[4][2][4] = {};
  for (int kb = kr; kb < in_p / 128; kb += ks) {
    __syncthreads();
    constexpr int row_u4 = 16 * K;  // uint4 per row of 8 tiles
    for (int v = tid; v < 8 * row_u4; v += 256) {
      const int ii = v / row_u4, o = v % row_u4;
      const uint4* src = reinterpret_cast<const uint4*>(pt->trellis + (int64_t(kb * 8 + ii) * tn + nb * 8) * 16 * K) + o;
      reinterpret_cast<uint4*>(tw)[v] = ld_nc4(src);
    }
    for (int r = warp; r < mtiles * 16; r += 8) {
      const int xr = rows_idx[r], k = kb * 128 + 4 * lane;
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        v[q] = (xr >= 0 && k + q < in) ? x[int64_t(xr) * ldx + k + q] * __half2float(__ushort_as_half(pt->suh[k + q])) : 0.f;
      warp_had128(v, lane);
      __half hi[4], lo[4];
      const float rsc = rows_scale[r];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float s = v[q] * kHad * rsc;
        hi[q] = __float2half_rn(s);
        lo[q] = __float2half_rn(s - __half2float(hi[q]));
      }
      *reinterpret_cast<uint2*>(Ahi + r * kAStride + 4 * lane) = make_uint2(pack2(hi[0], hi[1]), pack2(hi[2], hi[3]));
      if constexpr (SPLIT)
        *reinterpret_cast<uint2*>(Alo + r * kAStride + 4 * lane) = make_uint2(pack2(lo[0], lo[1]), pack2(lo[2], lo[3]));
    }
    __syncthreads();
#pragma unroll 2
    for (int ii = 0; ii < 8; ++ii) {
      __half w[8];
      lane_decode<K, CB>(tw + (ii * 8 + warp) * 8 * K, lane, w);
      const uint32_t b00 = pack2(w[0], w[1]), b01 = pack2(w[2], w[3]), b10 = pack2(w[4], w[5]), b11 = pack2(w[6], w[7]);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if (mt >= mtiles) break;
        const int o = (mt * 16 + g) * kAStride + ii * 16 + 2 * c4;
        uint32_t ah[4];
        ah[0] = *reinterpret_cast<const uint32_t*>(Ahi + o);
        ah[1] = *reinterpret_cast<const uint32_t*>(Ahi + o + 8 * kAStride);
        ah[2] = *reinterpret_cast<const uint32_t*>(Ahi + o + 8);
        ah[3] = *reinterpret_cast<const uint32_t*>(Ahi + o + 8 * kAStride + 8);
        mma_f16(acc[mt][0], ah, b00, b01);
        mma_f16(acc[mt][1], ah, b10, b11);
        if constexpr (SPLIT) {
          uint32_t al[4];
          al[0] = *reinterpret_cast<const uint32_t*>(Alo + o);
          al[1] = *reinterpret_cast<const uint32_t*>(Alo + o + 8 * kAStride);
          al[2] = *reinterpret_cast<const uint32_t*>(Alo + o + 8);
          al[3] = *reinterpret_cast<const uint32_t*>(Alo + o + 8 * kAStride + 8);
          mma_f16(acc[mt][0], al, b00, b01);
          mma_f16(acc[mt][1], al, b10, b11);
        }
      }
    }
  }
  __syncthreads();  // A is dead: the output tile reuses it
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int n8 = 0; n8 < 2; ++n8) {
      const int col = warp * 16 + n8 * 8 + 2 * c4, r = mt * 16 + g;
      Cs[r * kCStride + col] = acc[mt][n8][0];
      Cs[r * kCStride + col + 1] = acc[mt][n8][1];
      Cs[(r + 8) * kCStride + col] = acc[mt][n8][2];
      Cs[(r + 8) * kCStride + col + 1] = acc[mt][n8][3];
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ks > 1) {  // rank 0 adds the other ranks' partial tiles in rank order (deterministic)
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    if (kr == 0)
      for (int q = 1; q < ks; ++q) {
        const float* o = cl.map_shared_rank(Cs, q);
        for (int i = tid; i < nrows * kCStride; i += blockDim.x) Cs[i] += o[i];
      }
    cl.sync();  // the other ranks' shared memory stays alive until rank 0 has read it
    if (kr != 0) return;
  }
#endif
  __syncthreads();
  const bool remap = pt->out_rows != nullptr;
  for (int r = warp; r < nrows; r += 8) {
    float v[4];
    const float inv = __frcp_rn(rows_scale[r]);  // exact: a power of two
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = Cs[r * kCStride + 4 * lane + q] * inv;
    warp_had128(v, lane);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = nb * 128 + 4 * lane + q;
      float val = v[q] * kHad * __half2float(__ushort_as_half(pt->svh[col]));
      if (pt->bias) val += __half2float(__ushort_as_half(pt->bias[col]));
      if (remap) {
        Cs[r * kCStride + 4 * lane + q] = val;
      } else if (col < pt->rows && pt->row0 + col < out) {
        float* yp = y + int64_t(row0 + r) * ldy + pt->row0 + col;
        *yp = accumulate ? *yp + val : val;
      }
    }
  }
  if (remap) {
    __syncthreads();
    for (int j = tid; j < pt->rows && pt->row0 + j < out; j += blockDim.x) {
      const int col = pt->out_rows[j];
      if ((col >> 7) != nb) continue;
      for (int r = 0; r < nrows; ++r) {
        float* yp = y + int64_t(row0 + r) * ldy + pt->row0 + j;
        const float val = Cs[r * kCStride + (col & 127)];
        *yp = accumulate ? *yp + val : val;
      }
    }
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

size_t gemv_smem(int K, int P, int in_p) {
  return sizeof(float) * (size_t(P) * in_p + size_t(kGvWarps) * P * 128) + size_t(kGvWarps) * 64 * K * 4;
}

}  // namespace

// Raises the dynamic shared-memory limits once per device; the launchers call it too, so that direct
// callers (tests) need no set-up. The backend calls it through init_kernels() before any capture.
void init_exl3_kernels() {
  static std::mutex mu;
  static bool done[64] = {};
  int dev = 0, optin = 0;
  LILY_CU(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= 0 && dev < 64 && done[dev]) return;
  LILY_CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  optin -= 4096;  // room for the kernels' static shared memory
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb)
      dispatch(K, cb, [&](auto kc, auto cc) {
        constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
        LILY_CU(cudaFuncSetAttribute(exl3_gemv_kernel<k, c, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        LILY_CU(cudaFuncSetAttribute(exl3_gemv_kernel<k, c, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
        LILY_CU(cudaFuncSetAttribute(exl3_gemm_kernel<k, c, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(gemm_smem<k>())));
        LILY_CU(cudaFuncSetAttribute(exl3_gemm_kernel<k, c, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(gemm_smem<k>())));
      });
  if (dev >= 0 && dev < 64) done[dev] = true;
}

void exl3_decode_tiles(const uint16_t* trellis, int K, int cb, int in_p, int out_p, uint16_t* w_hat, cudaStream_t s) {
  if (in_p <= 0 || out_p <= 0 || in_p % 16 || out_p % 16) fail_internal("exl3_decode_tiles: sizes must be multiples of 16");
  dispatch(K, cb, [&](auto kc, auto cc) {
    decode_tiles_kernel<decltype(kc)::value, decltype(cc)::value>
        <<<dim3(unsigned(out_p / 16), unsigned(in_p / 16)), 32, 0, s>>>(trellis, out_p, w_hat);
  });
  LILY_CU_LAUNCH();
}

namespace {
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

struct ScratchEntry {
  SplitScratch sc;
  int refs = 0;
  int64_t blocks = 0;  // the most blocks of a split launch it serves
};
std::mutex g_scratch_mu;
std::map<cudaStream_t, ScratchEntry> g_scratch;

// The stream's scratch when it serves a split launch of `blocks` blocks, else an empty one.
SplitScratch split_scratch(cudaStream_t s, int64_t blocks) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  auto it = g_scratch.find(s);
  return it != g_scratch.end() && blocks <= it->second.blocks ? it->second.sc : SplitScratch{};
}

// Clusters of ks GEMV blocks (K, cb, P, smem) the device holds at once; asked once per shape and device.
int64_t gemv_cluster_fit(int K, int cb, int P, size_t smem, int ks) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, size_t, int>, int64_t> fit;
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  const auto key = std::tuple{dev, K, cb, P, smem, ks};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = fit.find(key); it != fit.end()) return it->second;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = cluster_launch(dim3(unsigned(ks * 64), 1), 32 * kGvWarps, smem, nullptr, ks, attr);
  int n = 0;
  dispatch(K, cb, [&](auto kc, auto cc) {
    constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
    if (P == 2)
      LILY_CU(cudaOccupancyMaxActiveClusters(&n, exl3_gemv_kernel<k, c, 2>, &cfg));
    else
      LILY_CU(cudaOccupancyMaxActiveClusters(&n, exl3_gemv_kernel<k, c, 1>, &cfg));
  });
  fit[key] = n;
  return n;
}
}  // namespace

namespace {
// k split of a GEMV of cols column blocks and `slots` slots while the grid stays within exl3_gemv_split blocks per
// SM and every warp keeps a k-tile row: over independent blocks (exl3_gemv_fixup, with the stream's scratch in
// fx) for inputs of at least exl3_fixup_min_in, any ks that leaves each warp exl3_split_rows k-tile rows; else over clusters of a power of two up to 8 that fit the GPU at once (clusters live within a
// GPC: at 8 blocks some SMs stay empty, and a cluster past the last that fits waits for a whole second wave).
int gemv_split(const Mat& W, int cols, int slots, int P, size_t smem, cudaStream_t s, SplitScratch& fx) {
  const int TK = W.in_p / 16, per_sm = kernel_switches().exl3_gemv_split;
  const int64_t units = int64_t(cols) * slots, cap = int64_t(per_sm) * device_sm_count();
  int ks = 1;
  fx = {};
  if (per_sm > 0 && kernel_switches().exl3_gemv_fixup && W.in_p >= kernel_switches().exl3_fixup_min_in) {
    const int rows = kernel_switches().exl3_split_rows;
    while (units * (ks + 1) <= cap && TK / (ks + 1) >= kGvWarps * rows) ++ks;
    if (ks > 1) fx = split_scratch(s, units * ks);
    if (fx.part) return ks;
    ks = 1;
  }
  if (per_sm > 0 && device_cc_major() >= 9) {
    while (ks < 8 && units * ks * 2 <= cap && TK / (2 * ks) >= kGvWarps) ks *= 2;
    while (ks > 1 && units > gemv_cluster_fit(W.K, W.cb, P, smem, ks)) ks /= 2;
  }
  return ks;
}
}  // namespace

Exl3GemvSplit exl3_gemv_split_of(const Mat& W, int slots, bool swiglu, cudaStream_t s) {
  init_exl3_kernels();
  const int P = swiglu ? 2 : 1;
  SplitScratch fx;
  const int ks = gemv_split(W, P == 2 ? W.col_blocks / 2 : W.col_blocks, slots, P, gemv_smem(W.K, P, W.in_p), s, fx);
  return {ks, fx.part != nullptr};
}

void exl3_split_scratch_acquire(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  ScratchEntry& e = g_scratch[s];
  if (e.refs++ > 0) return;
  e.blocks = int64_t(kSplitPerSmMax) * device_sm_count();
  LILY_CU(cudaMalloc(&e.sc.part, size_t(e.blocks) * 2 * 128 * sizeof(float)));
  LILY_CU(cudaMalloc(&e.sc.count, size_t(e.blocks) * sizeof(unsigned)));
  LILY_CU(cudaMemset(e.sc.count, 0, size_t(e.blocks) * sizeof(unsigned)));
}

void exl3_split_scratch_release(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  auto it = g_scratch.find(s);
  if (it == g_scratch.end() || --it->second.refs > 0) return;
  cudaFree(it->second.sc.part);
  cudaFree(it->second.sc.count);
  g_scratch.erase(it);
}

void exl3_gemv_slots(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv,
                     int slots, float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s,
                     const float* norm_w, float eps) {
  if (slots <= 0) return;
  init_exl3_kernels();
  const int P = swiglu_I > 0 ? 2 : 1;
  if (P == 2 && W.nparts != 2) fail_internal("EXL3 GEMV: swiglu mode needs gate and up as the two parts of each expert");
  if (in > W.in_p) fail_internal("EXL3 GEMV: input wider than the padded input width");
  const int cols = P == 2 ? W.col_blocks / 2 : W.col_blocks;
  const size_t smem = gemv_smem(W.K, P, W.in_p);
  SplitScratch fx;
  const int ks = gemv_split(W, cols, slots, P, smem, s, fx);
  // PDL for all but cluster launches (measured: the two together lost 10% on the 35B shape, bench/RESULTS.md)
  const bool cluster = ks > 1 && !fx.part;
  PdlLaunch L(dim3(unsigned(cols * ks), unsigned(slots)), dim3(32 * kGvWarps), smem, s,
              cluster ? unsigned(ks) : 0u, kernel_switches().exl3_pdl && !cluster);
  dispatch(W.K, W.cb, [&](auto kc, auto cc) {
    constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
    auto launch = [&](auto kernel, int sw) {
      LILY_CU(cudaLaunchKernelEx(&L.cfg, kernel, W.parts, W.nparts, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, sw,
                                 norm_w, eps, ks, fx));
    };
    if (P == 2)
      launch(exl3_gemv_kernel<k, c, 2>, swiglu_I);
    else
      launch(exl3_gemv_kernel<k, c, 1>, 0);
  });
}

void exl3_gemm_tiles(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                     int64_t ldy, bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T,
                     cudaStream_t s, int x_rows) {
  if (max_tiles <= 0) return;
  init_exl3_kernels();
  if (in > W.in_p) fail_internal("EXL3 GEMM: input wider than the padded input width");
  const dim3 grid(unsigned(W.col_blocks), unsigned(max_tiles));
  const GemmPrec prec = gemm_prec_for(W);
  const RowScales rs = row_scales(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, x_rows, s);  // every mode
  dispatch(W.K, W.cb, [&](auto kc, auto cc) {
    constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
    if (prec == GemmPrec::kSplit)
      exl3_gemm_kernel<k, c, true><<<grid, 256, gemm_smem<k>(), s>>>(W.parts, W.nparts, out, in, x, ldx, gather, y,
                                                                     ldy, accumulate, tiles, n_tiles, T, 1, rs);
    else
      exl3_gemm_kernel<k, c, false><<<grid, 256, gemm_smem<k>(), s>>>(W.parts, W.nparts, out, in, x, ldx, gather, y,
                                                                      ldy, accumulate, tiles, n_tiles, T, 1, rs);
  });
  LILY_CU_LAUNCH();
}

bool exl3_rows(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s) {
  if (!W.exl3 || T < 1 || T > kGemmBM || in > W.in_p || W.col_blocks <= 0) return false;
  init_exl3_kernels();
  // clusters of up to 8 blocks along x share a column block's k chunks (at least two chunks each) until
  // the grid has ~2 blocks per SM
  const int chunks = W.in_p / 128;
  int ks = 1;
  if (device_cc_major() >= 9)
    while (ks < 8 && int64_t(W.col_blocks) * ks < 2 * device_sm_count() && chunks / (2 * ks) >= 2) ks *= 2;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = cluster_launch(dim3(unsigned(W.col_blocks * ks), 1), 256, 0, s, ks, attr);
  dispatch(W.K, W.cb, [&](auto kc, auto cc) {
    constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
    cfg.dynamicSmemBytes = gemm_smem<k>();
    LILY_CU(cudaLaunchKernelEx(&cfg, exl3_gemm_kernel<k, c, true>, W.parts, W.nparts, out, in, x, ldx,
                               static_cast<const int32_t*>(nullptr), y, ldy, accumulate,
                               static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr), T, ks,
                               RowScales{}));
  });
  return true;
}

}  // namespace lily::cuda
