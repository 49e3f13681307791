// Internal launchers shared between the .cu files of the CUDA backend.
#pragma once
#include <cstdlib>
#include <utility>

#include "backend/cuda/common.cuh"

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

// LILY_PDL=0 turns programmatic dependent launch off (A/B measurements, debugging).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LILY_PDL");
    return !(v && v[0] == '0');
  }();
  return on;
}

// Launch configuration for cudaLaunchKernelEx with programmatic stream serialization when PDL is
// enabled: the kernel may start while the previous one finishes and must call grid_dependency_wait()
// before reading anything that kernel writes. Not copyable (cfg.attrs points into the object).
struct PdlLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  PdlLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
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
                     cudaStream_t s);

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
