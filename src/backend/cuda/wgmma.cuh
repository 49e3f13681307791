// Hopper building blocks of the wgmma GEMMs (gemm_wgmma.cu, gemm_wgmma_rs.cu): mbarriers, tensor-map copies
// (TMA), register reallocation between warpgroups, shared-memory matrix descriptors, wgmma fences / groups; and
// the host's tensor-map encoding. The device side compiles in the sm_90a pass only (LILY_WGMMA_CODE); the
// kernels trap in other passes and their launchers decline other devices.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LILY_WGMMA_CODE 1
#endif

namespace lily::cuda::wg {

#ifdef LILY_WGMMA_CODE
__device__ __forceinline__ void bar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
// bar_arrive where pred holds, predicated inside the asm: no branch between the wgmma groups in flight (a
// divergent branch there makes ptxas drain and serialise them).
__device__ __forceinline__ void bar_arrive_if(uint32_t bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar),
      "r"(int(pred))
      : "memory");
}
// One arrival that also expects `bytes` more of copy-engine transactions in the current phase.
__device__ __forceinline__ void bar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One box of a 2-D / 3-D tensor map at coordinates (c0 innermost, ...) into shared memory, counted on bar.
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void reg_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (tile 1024-aligned).
// +2 per 16 more k (32 bytes).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Keeps the compiler from moving register accesses across the wgmma fences and waits (accumulators), and keeps
// registers an issued wgmma still reads alive until the wait that retires it (register A operands).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
#endif

// The persistent walk of both kernels: units of one tile of <= kUnitRows product rows (an entry of the tile map
// (e, row0, rows), or kUnitRows dense rows) × kUnitCols output columns; CTA b takes units b, b + grid, ...;
// unit w = (tile w / nblk, column block w % nblk), so the CTAs in flight share a tile's rows and an expert's
// weights (raster 1: the transpose).
constexpr int kUnitRows = 128, kUnitCols = 256, kStageK = 64;
struct Unit {
  int e, row0, nrows, nb;
};
struct UnitWalk {
  const int32_t* tiles;
  int T, raster, live, nblk, nk, n_units;
  __device__ UnitWalk(int out, int in, int T_, const int32_t* tiles_, const int32_t* n_tiles, int raster_)
      : tiles(tiles_), T(T_), raster(raster_) {
    live = tiles ? *n_tiles : (T + kUnitRows - 1) / kUnitRows;
    nblk = (out + kUnitCols - 1) / kUnitCols;
    nk = (in + kStageK - 1) / kStageK;
    const int n_work = live * nblk;
    n_units = n_work > int(blockIdx.x) ? (n_work - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  }
  __device__ Unit operator()(int u) const {
    const int w = int(blockIdx.x) + u * int(gridDim.x);
    const int tile = raster ? w % live : w / nblk;
    Unit un;
    un.nb = raster ? w / live : w % nblk;
    if (tiles) {
      un.e = tiles[3 * tile];
      un.row0 = tiles[3 * tile + 1];
      un.nrows = min(tiles[3 * tile + 2], kUnitRows);
    } else {
      un.e = 0;
      un.row0 = tile * kUnitRows;
      un.nrows = min(kUnitRows, T - un.row0);
    }
    return un;
  }
};
// The arguments both kernels take (the staged rows as A or B, the weights by tensor map or from registers).
struct Args {
  int out, in, T;
  float* y;
  int64_t ldy;
  int accumulate;
  const int32_t* tiles;
  const int32_t* n_tiles;
  const float* scales;  // fp16: the staged rows' powers of two, by product row
  const uint16_t* s;    // affine scales / biases (bf16), expert e at + e·sstride, row n at + n·ngroups
  const uint16_t* b;
  int64_t sstride;
  int gs, ngroups;
  int raster;           // 0: unit w = (tile w / nblk, block w % nblk); 1: (tile w % live, block w / live)
};

// Units per launch: one CTA per SM at most.
inline unsigned unit_grid(int max_tiles_or_0, int T, int out, int sms) {
  const int64_t tiles = max_tiles_or_0 > 0 ? max_tiles_or_0 : (int64_t(T) + kUnitRows - 1) / kUnitRows;
  const int64_t units = tiles * ((int64_t(out) + kUnitCols - 1) / kUnitCols);
  return unsigned(units < sms ? units : sms);
}

// Byte offset of (row r, 16-byte chunk c) in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return uint32_t(r) * 128u + (uint32_t((c ^ r) & 7) << 4); }

// ---- host ----
inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A tiled tensor map of rank 2 or 3 (dims innermost first, strides of dims 1 (and 2) in bytes, a box of
// b0 × b1 (× 1)). Out-of-range elements of a box read as zeros.
inline bool make_map(CUtensorMap& m, CUtensorMapDataType dt, const void* base, int rank, const uint64_t* dims,
                     const uint64_t* strides, uint32_t b0, uint32_t b1, CUtensorMapSwizzle sw) {
  const auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t d[3] = {dims[0], dims[1], rank > 2 ? dims[2] : 1};
  const cuuint64_t st[2] = {strides[0], rank > 2 ? strides[1] : 0};
  const cuuint32_t box[3] = {b0, b1, 1}, es[3] = {1, 1, 1};
  return fn(&m, dt, cuuint32_t(rank), const_cast<void*>(base), d, st, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace lily::cuda::wg
