// EXL3 (trellis-coded) weights on the device, see shared/docs/exl3-format.md and quant/exl3/exl3.h.
//   - tile decode: a warp decodes one 16x16 tile, lane L the stream positions 8L..8L+7, which are
//     exactly the B fragments of two mma.m16n8k16 (k rows 2(L%4)+{0,1,8,9}, n columns L/4 and L/4+8).
//   - GEMV (decode rows, MoE slots): one block per (slot, 128-column block of a part), or a thread-block
//     cluster of ks blocks (sm_90) that split its k-tile rows when the grid would leave SMs idle. The input
//     row (optionally RMS-normalised) ⊙ suh goes through the Hadamard-128 (a warp per 128-chunk, in
//     registers) into shared memory; every warp walks k-tile rows, streams the packed words of 8 tiles (one
//     row of the 128-column block) into a per-warp buffer and decodes them in registers against the staged
//     input; the block then reduces (rank 0 of a cluster adds the other ranks' sums from their shared memory,
//     in rank order), applies the output Hadamard-128 (a warp per part), svh, bias and the logical column map
//     (or silu(gate)·up in swiglu mode).
//   - GEMM (prompts, MoE tile map, few dense rows): exl3_gemm.cu; shared device pieces: exl3_tile.cuh.
// Weights are never dequantised to global memory.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/device_info.h"
#include "backend/cuda/exl3_tile.cuh"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kGvWarps = 16;  // GEMV warps per block

// Partial sums [unit][rank][P·128] and one arrival counter per unit (column block and slot), zero between launches.
struct SplitScratch {
  float* part = nullptr;
  unsigned* count = nullptr;
};
constexpr int kSplitPerSmMax = 4;  // KernelSwitches::exl3_gemv_split's upper bound: blocks of a split launch per SM

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
// the last block of the column block to arrive adds them (in rank order too) and finishes. K <= 4: registers
// capped for two blocks per SM (the split's grids count on them).
// cw set (P = 1, ks = 1, fx set: MoE down + combine): slot s belongs to token s / kk; y is the residual, row t
// at y + t·ldy, and gets y[t, r] += Σ_j cw[t·kk + j] · (slot t·kk + j's output r), the sum in slot order (as
// combine_kernel, so bit-identical to the products into a buffer and that kernel): each block stores its
// padded columns to fx.part, the last of the token's kk blocks of its column block adds them.
template <int K, int CB, int P>
__global__ void __launch_bounds__(32 * kGvWarps, K <= 4 ? 2 : 1) exl3_gemv_kernel(const Exl3Part* __restrict__ parts, int nparts,
    const int32_t* __restrict__ expert, int out, int in, const float* __restrict__ x, int64_t ldx, int xdiv,
    float* __restrict__ y, int64_t ldy, bool accumulate, int swiglu_I, const float* __restrict__ norm_w, float eps,
    int ks, SplitScratch fx, const float* __restrict__ cw, int kk) {
  extern __shared__ __align__(16) float smem[];
  __shared__ float rsum[32];
  __shared__ __align__(16) float ov[P * 128];
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
  // 128-chunks q ≡ kr (mod ks) (the last pair may be half): only those are staged. A warp stages a chunk
  // (lane: elements 4·lane..4·lane+3) ⊙ each part's suh and puts it through the Hadamard-128 in registers
  // (warp_had128: the butterflies of a shared-memory FWHT in the same order, so the same sums), then stores it:
  // one barrier, not one per butterfly stage.
  static_assert(kGvWarps * 16 == 256, "one k-tile row per warp covers a pair of 128-chunks");
  const int nchunk = in_p / 128, mine = ((nchunk + 1) / 2 - kr + ks - 1) / ks;
  for (int t = warp; t < 2 * mine; t += kGvWarps) {
    const int c = 2 * (kr + ks * (t >> 1)) + (t & 1);
    if (c >= nchunk) continue;
    const int k0 = c * 128 + 4 * lane;
    float xv[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int k = k0 + q;
      xv[q] = k < in ? (norm_w ? xr[k] * inv * norm_w[k] : xr[k]) : 0.f;
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = xv[q] * __half2float(__ushort_as_half(pt[p].suh[k0 + q]));
      warp_had128(v, lane);
      *reinterpret_cast<float4*>(xh + p * in_p + k0) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
  __syncthreads();
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
  // output Hadamard-128 of part `warp`'s sums in registers (as the input's), one barrier
  if (warp < P) {
    float4* o4 = reinterpret_cast<float4*>(ov + warp * 128) + lane;
    const float4 f = *o4;
    float v[4] = {f.x, f.y, f.z, f.w};
    warp_had128(v, lane);
    *o4 = make_float4(v[0], v[1], v[2], v[3]);
  }
  __syncthreads();
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
    if (cw) {
      const int t = threadIdx.x, cols = gridDim.x, tok = slot / kk, unit = tok * cols + nb;
      if (t < 128) __stcg(fx.part + (int64_t(slot) * cols + nb) * 128 + t, value(*pt, 0, nb * 128 + t));
      __threadfence();
      __syncthreads();
      if (t == 0) {
        fix_last = atomicAdd(fx.count + unit, 1u) == unsigned(kk - 1);
        if (fix_last) fx.count[unit] = 0u;  // back at zero for the next launch on this stream
      }
      __syncthreads();
      if (!fix_last) return;
      __threadfence();
      float* yt = y + int64_t(tok) * ldy + pt->row0;
      auto add = [&](int j, int col) {
        float acc = yt[j];
        for (int q = 0; q < kk; ++q) {
          const int sq = tok * kk + q;
          acc += cw[sq] * __ldcg(fx.part + (int64_t(sq) * cols + nb) * 128 + (col & 127));
        }
        yt[j] = acc;
      };
      if (!pt->out_rows) {
        const int j = nb * 128 + t;
        if (t < 128 && j < pt->rows && pt->row0 + j < out) add(j, j);
      } else {
        for (int j = t; j < pt->rows && pt->row0 + j < out; j += blockDim.x)
          if ((pt->out_rows[j] >> 7) == nb) add(j, pt->out_rows[j]);
      }
      return;
    }
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
      });
  init_exl3_gemm_kernels();
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
                                 norm_w, eps, ks, fx, static_cast<const float*>(nullptr), 1));
    };
    if (P == 2)
      launch(exl3_gemv_kernel<k, c, 2>, swiglu_I);
    else
      launch(exl3_gemv_kernel<k, c, 1>, 0);
  });
}

bool exl3_gemv_combine(const Mat& W, const int32_t* expert, int out, int in, const float* h, int64_t ldh,
                       const float* weights, int kk, int T, float* x, int64_t ldx, cudaStream_t s) {
  if (!W.exl3 || W.nparts != 1 || T <= 0 || kk <= 0 || !kernel_switches().exl3_down_combine) return false;
  if (in > W.in_p) fail_internal("EXL3 GEMV: input wider than the padded input width");
  init_exl3_kernels();
  const int cols = W.col_blocks, slots = T * kk;
  const size_t smem = gemv_smem(W.K, 1, W.in_p);
  SplitScratch fx;
  if (gemv_split(W, cols, slots, 1, smem, s, fx) != 1) return false;  // split launches keep the scratch for their sums
  // the slots' outputs: slots·cols column blocks of 128 floats (the scratch holds 2·128 per block it serves);
  // one counter per (token, column block)
  fx = split_scratch(s, std::max<int64_t>((int64_t(slots) * cols + 1) / 2, int64_t(T) * cols));
  if (!fx.part) return false;
  PdlLaunch L(dim3(unsigned(cols), unsigned(slots)), dim3(32 * kGvWarps), smem, s, 0u, kernel_switches().exl3_pdl);
  dispatch(W.K, W.cb, [&](auto kc, auto cc) {
    constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
    LILY_CU(cudaLaunchKernelEx(&L.cfg, exl3_gemv_kernel<k, c, 1>, W.parts, W.nparts, expert, out, in, h, ldh, 1, x, ldx,
                               true, 0, static_cast<const float*>(nullptr), 0.f, 1, fx, weights, kk));
  });
  return true;
}

}  // namespace lily::cuda
