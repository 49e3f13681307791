// Internal launchers shared between the .cu files of the CUDA backend.
#pragma once
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/switches.h"

namespace lily::cuda {

// Waits for the previous kernel of the stream (and its memory) when launched with programmatic
// stream serialization; a no-op otherwise and before sm_90.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Lets the next kernel of the stream (when launched with PDL) be scheduled once every block of this one
// has called this or exited; its blocks then run up to their grid_dependency_wait() while this kernel
// finishes. Without it the implicit trigger is block exit and the next launch overlaps nothing.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Entry of a kernel with no work that is independent of the previous kernel: trigger, then wait.
__device__ __forceinline__ void pdl_entry() {
  allow_dependent_launch();
  grid_dependency_wait();
}

// KernelSwitches::pdl off: plain stream serialization (A/B measurements, debugging).
inline bool pdl_enabled() { return kernel_switches().pdl; }

// Launch configuration for cudaLaunchKernelEx with programmatic stream serialization when PDL is
// enabled: the kernel may start while the previous one finishes and must call grid_dependency_wait()
// before reading anything that kernel writes. cluster_x > 0: thread-block clusters of cluster_x CTAs
// along x (sm_90). pdl false: plain serialization for this launch. Not copyable (cfg.attrs points into the object).
struct PdlLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};
  PdlLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, unsigned cluster_x = 0, bool pdl = true) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    unsigned n = 0;
    if (cluster_x > 0) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = cluster_x;
      attr[n].val.clusterDim.y = 1;
      attr[n].val.clusterDim.z = 1;
      ++n;
    }
    if (pdl && pdl_enabled()) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n].val.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
  }
  PdlLaunch(const PdlLaunch&) = delete;
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

// kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialization (see PdlLaunch); the
// kernel must call grid_dependency_wait() (or pdl_entry()) before touching activations.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  PdlLaunch L(grid, block, smem, s);
  LILY_CU(cudaLaunchKernelEx(&L.cfg, kernel, std::forward<Args>(args)...));
}

// Top-k routing of one token (moe.cu's contract), run by one warp: top-k of logits l[0, E) (ties: lowest
// index), weights softmax over the chosen (norm_topk) or over all E; with `shared` a (k+1)-th slot for
// expert E weighted sigmoid(l[E]) (shared_gated) or 1. Rows of idx / w hold k (+1) entries. Loads bypass
// L1 (the logits may come from other blocks of the calling kernel).
struct TopkArgs {
  int E = 0, k = 0;
  bool norm_topk = true, shared = false, shared_gated = false;
  int32_t* idx = nullptr;
  float* w = nullptr;
};
constexpr int kTopkMaxPerLane = 16;  // E <= 512
__device__ __forceinline__ void topk_warp(const float* __restrict__ l, int t, const TopkArgs& a) {
  const int lane = threadIdx.x & 31;
  float v[kTopkMaxPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kTopkMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < a.E ? __ldcg(l + e) : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  const float gmax = warp_max(mx);
  float se = 0.f;
#pragma unroll
  for (int i = 0; i < kTopkMaxPerLane; ++i) se += lane + 32 * i < a.E ? expf(v[i] - gmax) : 0.f;
  const float total = warp_sum(se);
  float first = 0.f, denom = 0.f, mine = 0.f;
  int myidx = 0;
  for (int j = 0; j < a.k; ++j) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kTopkMaxPerLane; ++i)
      if (v[i] > best) { best = v[i]; bi = lane + 32 * i; }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (j == 0) first = best;
    denom += expf(best - first);
    if (lane == j) { mine = best; myidx = bi; }
#pragma unroll
    for (int i = 0; i < kTopkMaxPerLane; ++i)
      if (lane + 32 * i == bi) v[i] = -INFINITY;
  }
  const int kk = a.shared ? a.k + 1 : a.k;
  if (lane < a.k) {
    a.idx[int64_t(t) * kk + lane] = myidx;
    a.w[int64_t(t) * kk + lane] = a.norm_topk ? expf(mine - first) / denom : expf(mine - gmax) / total;
  } else if (a.shared && lane == a.k) {
    a.idx[int64_t(t) * kk + a.k] = a.E;
    a.w[int64_t(t) * kk + a.k] = a.shared_gated ? sigmoid(__ldcg(l + a.E)) : 1.f;
  }
}

// Router GEMV with the top-k folded in (gemv.cu): `rows` tokens (1..kTopkFoldRows, x rows of `in`, y rows of
// `out`), y = W·norm(x) as gemv_slots, then the last block to finish runs topk_warp on each token's row (a warp
// per token). counter: a device word that is 0 before the call and after it. Returns false (nothing launched)
// when the streaming GEMV does not take W or the rows.
bool gemv_topk(const Mat& W, int out, int in, const float* x, int rows, float* y, const float* norm_w, float eps,
               const TopkArgs& topk, unsigned* counter, cudaStream_t s);

constexpr int kGemmBM = 64;  // rows of x per GEMM tile
constexpr int kGemmBN = 64;  // output columns per GEMM tile

// Decode GEMV (gemv.cu): bf16 with 16-byte aligned rows (in % 8 == 0) or affine 4/8 bit; same contract
// as gemv_slots.
void gemv_fast(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
               float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps);
void init_gemv_kernels();


inline bool has(const Mat& m) { return m.exl3 ? m.parts != nullptr : m.affine ? m.q != nullptr : m.w != nullptr; }

// EXL3 launchers (exl3.cu): same contracts as gemv_slots / gemm_tiles (ops.h).
void exl3_gemv_slots(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv,
                     int slots, float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s,
                     const float* norm_w, float eps);
void exl3_gemm_tiles(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                     int64_t ldy, bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T,
                     cudaStream_t s, int x_rows = 0);

// Rows of output tile `tile` of a prompt product: entry `tile` of the MoE tile map (tiles: [n][3] = expert,
// first row, rows, at most bm; *n_tiles entries) or, without a map, rows tile·bm .. of T. False past the map's end.
__device__ __forceinline__ bool tile_rows(const int32_t* tiles, const int32_t* n_tiles, int tile, int T, int bm, int& e,
                                          int& row0, int& nrows) {
  if (!tiles) {
    e = 0, row0 = tile * bm, nrows = min(bm, T - row0);
    return true;
  }
  if (tile >= *n_tiles) return false;
  e = tiles[3 * tile], row0 = tiles[3 * tile + 1], nrows = min(tiles[3 * tile + 2], bm);
  return true;
}

// Element (r, i) of expert e of W as float (scalar path: GEMM staging, embedding gather).
__device__ __forceinline__ float mat_at(const Mat& m, int e, int64_t r, int64_t i, int in) {
  if (!m.affine) return bf(m.w[int64_t(e) * m.estride + r * m.ld + i]);
  const uint32_t* row = m.q + int64_t(e) * m.qstride + r * m.row_words;
  const int64_t bit = i * m.bits;
  const uint32_t code = (row[bit >> 5] >> (bit & 31)) & ((1u << m.bits) - 1u);  // bits 4, 8 never straddle words
  const int64_t gi = int64_t(e) * m.sstride + r * (in / m.gs) + i / m.gs;
  return bf(m.s[gi]) * float(code) + bf(m.b[gi]);
}

}  // namespace lily::cuda
