// Hopper GEMM for prompt products on wgmma, fed by the copy engine, warp-specialised and persistent:
//   y[r, n] (= or +=) Σ_k x[src(r), k] · W_e[n, k],  bf16 operands, fp32 accumulation and output.
//
// Work unit: one tile of <= 64 rows (an entry of the expert tile map, or 64 dense rows) × 256 output
// columns. The CTAs (one per SM) walk the units persistently, unit w = (tile w % live, column block
// w / live), so the CTAs in flight share a column block's weights. 384 threads:
//   warpgroup 0, the producer. Its warp 0 also requests the raw stages from the copy engine, RS - 1 stages
//     ahead: the tile's fp32 input rows, one bulk copy per row (gathered rows cost nothing extra), and for
//     affine weights the packed codes of the 256 rows (a 3-D tensor map: code words × rows × experts). All
//     128 threads then turn a raw stage into an operand stage: inputs fp32 → bf16; affine codes → s·q + b
//     in bf16 (q shifted into the mantissa of 1.0f, f = 1 + q·2^-bits, s·q + b = fma(f, s·2^bits,
//     b − s·2^bits); scales and biases read one stage ahead into registers). Operands are written in the
//     128-byte-swizzled K-major layout wgmma reads (row r of 64 bf16 = 128 bytes at r·128, its 16-byte
//     chunk c at chunk c ^ (r % 8)), followed by fence.proxy.async. bf16 weights come straight into the
//     operand stage by a 3-D tensor map with the same swizzle.
//   warpgroups 1 and 2, the consumers: each multiplies the 64 rows by its 128 columns of a stage
//     (4 × wgmma m64n128k16 per 64-deep stage, operands from shared memory), keeps 64 fp32 accumulators
//     per thread and writes its outputs from registers once the unit's last stage is done.
// Two rings of mbarrier-guarded slots: RS raw stages (copy engine → producer) and kOS operand stages
// (producer, and the copy engine for bf16 weights → consumers), each slot with a full and an empty barrier.
// The instructions need sm_90a; the sm_80 build of this file traps, and gemm_wgmma declines other devices.
#include "backend/cuda/gemm_wgmma.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LILY_WGMMA_CODE 1
#endif

namespace lily::cuda {
namespace {

constexpr int kBM = 64;   // rows per unit: the tile map's tiles (kGemmBM)
constexpr int kBN = 256;  // columns per unit: two consumer warpgroups × 128
constexpr int kBK = 64;   // k per stage: one 128-byte swizzle row of bf16
constexpr int kThreads = 384;
constexpr int kOS = 3;                                 // operand stages
constexpr uint32_t kOpA = kBM * kBK * 2;               // 8 KB: 64 rows × 64 bf16
constexpr uint32_t kOpB = kBN * kBK * 2;               // 32 KB: 256 rows × 64 bf16
constexpr uint32_t kOpStage = kOpA + kOpB;
constexpr uint32_t kRawRow = kBK * 4;                  // a raw input row: 64 fp32
constexpr uint32_t kRawA = kBM * kRawRow;              // 16 KB
static_assert(kBM == kGemmBM, "units are the tile map's tiles");

// WB: 0 bf16 weights, 4 / 8 affine bits.
template <int WB>
struct Cfg {
  static constexpr int RS = WB == 0 ? 4 : 3;               // raw stages
  static constexpr int CW = WB * kBK / 32;                 // code words per row and stage
  static constexpr uint32_t RAW_B = uint32_t(kBN) * CW * 4;  // codes of a stage
  static constexpr uint32_t RAW = kRawA + RAW_B;
  static constexpr size_t SMEM = 1024 + size_t(kOS) * kOpStage + size_t(RS) * RAW + 16 * size_t(kOS + RS);
};

struct Args {
  int out, in;
  const float* x;
  int64_t ldx;
  const int32_t* gather;
  float* y;
  int64_t ldy;
  int accumulate;
  const int32_t* tiles;
  const int32_t* n_tiles;
  int T;
  const uint16_t* s;  // affine scales / biases (bf16), expert e at + e·sstride, row n at + n·ngroups
  const uint16_t* b;
  int64_t sstride;
  int gs, ngroups;
};

#ifdef LILY_WGMMA_CODE
__device__ __forceinline__ void bar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
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
// Global → shared bulk copy of `bytes` (multiple of 16, both ends 16-byte aligned), counted on bar.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// One box of a 3-D tensor map at coordinates (c0 innermost, c1, c2) into shared memory, counted on bar.
__device__ __forceinline__ void tma_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (tile 1024-aligned).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// d (64 rows × 128 columns over the warpgroup; thread layout: rows 16·warp + lane/4 (+8), columns
// 8j + 2·(lane % 4) (+1) in d[4j .. 4j+3]) += A (64 × 16, descriptor da) · B (128 × 16, descriptor db)ᵀ.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(1));
}
// Keeps the compiler from moving accumulator accesses across the wgmma waits.
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Byte offset of (row r, 16-byte chunk c) in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return uint32_t(r) * 128u + (uint32_t((c ^ r) & 7) << 4); }

// Eight consecutive codes (one 16-byte output chunk) → eight bf16 values s·q + b.
template <int WB>
__device__ __forceinline__ uint4 dequant8(const uint32_t* w, uint32_t sb) {
  const float sc = __uint_as_float(sb << 16), bi = __uint_as_float(sb & 0xFFFF0000u);
  const float m = sc * float(1 << WB), c0 = bi - m;
  float v[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    uint32_t t;
    if constexpr (WB == 4) {
      t = u < 5 ? w[0] << (19 - 4 * u) : w[0] >> (4 * u - 19);
      t = (t & 0x00780000u) | 0x3f800000u;
    } else {
      const uint32_t word = w[u >> 2];
      const int p = 8 * (u & 3);
      t = p <= 15 ? word << (15 - p) : word >> (p - 15);
      t = (t & 0x007F8000u) | 0x3f800000u;
    }
    v[u] = fmaf(__uint_as_float(t), m, c0);
  }
  return make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}
#endif

template <int WB>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmB, const Args a) {
#ifdef LILY_WGMMA_CODE
  using C = Cfg<WB>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* op = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* raw = op + kOS * kOpStage;
  const uint32_t op_full = smem_u32(raw + C::RS * C::RAW), op_empty = op_full + 8 * kOS;
  const uint32_t raw_full = op_empty + 8 * kOS, raw_empty = raw_full + 8 * C::RS;
  const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
  if (tid == 0) {
    for (int i = 0; i < kOS; ++i) {
      bar_init(op_full + 8 * i, 128 + (WB == 0 ? 1 : 0));  // the producer's threads (+ the weights' copy)
      bar_init(op_empty + 8 * i, 2);                       // one per consumer warpgroup
    }
    for (int i = 0; i < C::RS; ++i) {
      bar_init(raw_full + 8 * i, 1);     // the requesting lane, with the bytes
      bar_init(raw_empty + 8 * i, 128);  // the producer's threads
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int live = a.tiles ? *a.n_tiles : (a.T + kBM - 1) / kBM;
  const int nblk = (a.out + kBN - 1) / kBN, nk = (a.in + kBK - 1) / kBK;
  const int n_work = live * nblk;
  const int n_units = n_work > int(blockIdx.x) ? (n_work - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int n_stages = n_units * nk;
  struct Unit {
    int e, row0, nrows, nb;
  };
  auto unit = [&](int u) {
    const int w = int(blockIdx.x) + u * int(gridDim.x), tile = w % live;
    Unit un;
    un.nb = w / live;
    if (a.tiles) {
      un.e = a.tiles[3 * tile];
      un.row0 = a.tiles[3 * tile + 1];
      un.nrows = min(a.tiles[3 * tile + 2], kBM);
    } else {
      un.e = 0;
      un.row0 = tile * kBM;
      un.nrows = min(kBM, a.T - un.row0);
    }
    return un;
  };

  if (wg == 0) {
    // ---------------- producer ----------------
    const int warp = t >> 5, lane = t & 31;
    // Raw stage j into slot j % RS (warp 0, every lane).
    auto request = [&](int j) {
      const int slot = j % C::RS;
      if (lane == 0) bar_wait(raw_empty + 8 * slot, ((j / C::RS) & 1) ^ 1);
      __syncwarp();
      const Unit un = unit(j / nk);
      const int k0 = (j % nk) * kBK;
      const uint32_t seg = uint32_t(min(kBK, a.in - k0)) * 4;
      unsigned char* dst = raw + slot * C::RAW;
      const uint32_t bar = raw_full + 8 * slot;
      if (lane == 0) bar_arrive_tx(bar, uint32_t(un.nrows) * seg + C::RAW_B);
      __syncwarp();
      for (int r = lane; r < un.nrows; r += 32) {
        const int src = a.gather ? a.gather[un.row0 + r] : un.row0 + r;
        bulk_g2s(smem_u32(dst + r * kRawRow), a.x + int64_t(src) * a.ldx + k0, seg, bar);
      }
      if constexpr (WB != 0)
        if (lane == 0) tma_3d(smem_u32(dst + kRawA), &tmB, (k0 * WB) / 32, un.nb * kBN, un.e, bar);
    };
    // This thread's affine rows n = t/8 + 16q of a stage (output chunk c = t % 8): packed scale | bias << 16
    // of the group holding k0 + 8c (zero past the matrix).
    const int c = t & 7;
    uint32_t sb_cur[16], sb_nxt[16];
    auto load_scales = [&](int j, uint32_t (&sb)[16]) {
      if constexpr (WB != 0) {
        const Unit un = unit(j / nk);
        const int k = (j % nk) * kBK + 8 * c;
        const int64_t base = int64_t(un.e) * a.sstride + k / a.gs;
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const int n = un.nb * kBN + (t >> 3) + 16 * q;
          const bool ok = n < a.out && k < a.in;
          const int64_t gi = base + int64_t(n) * a.ngroups;
          sb[q] = ok ? uint32_t(__ldg(a.s + gi)) | (uint32_t(__ldg(a.b + gi)) << 16) : 0u;
        }
      }
    };
    if (warp == 0)
      for (int j = 0; j < min(C::RS - 1, n_stages); ++j) request(j);
    if (n_stages > 0) load_scales(0, sb_cur);
    for (int i = 0; i < n_stages; ++i) {
      if (warp == 0 && i + C::RS - 1 < n_stages) request(i + C::RS - 1);
      const int os = i % kOS, rs = i % C::RS;
      const Unit un = unit(i / nk);
      const int k0 = (i % nk) * kBK;
      unsigned char* opA = op + os * kOpStage;
      unsigned char* opB = opA + kOpA;
      bar_wait(op_empty + 8 * os, ((i / kOS) & 1) ^ 1);
      if constexpr (WB == 0)
        if (t == 0) {
          bar_arrive_tx(op_full + 8 * os, kOpB);
          tma_3d(smem_u32(opB), &tmB, k0, un.nb * kBN, un.e, op_full + 8 * os);
        }
      if (i + 1 < n_stages) load_scales(i + 1, sb_nxt);
      bar_wait(raw_full + 8 * rs, (i / C::RS) & 1);
      const unsigned char* rA = raw + rs * C::RAW;
      // inputs: pass p covers rows 8p .. 8p+7, thread t row 8p + t/16, elements 4·(t % 16) .. +3
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const int r = 8 * p + (t >> 4), kk = 4 * (t & 15);
        uint2 v = make_uint2(0u, 0u);
        if (r < un.nrows && k0 + kk < a.in) {
          const float4 f = *reinterpret_cast<const float4*>(rA + r * kRawRow + kk * 4);
          v = make_uint2(pack_bf16x2(f.x, f.y), pack_bf16x2(f.z, f.w));
        }
        *reinterpret_cast<uint2*>(opA + sw128(r, kk >> 3) + ((kk & 4) << 1)) = v;
      }
      if constexpr (WB != 0) {
        const uint32_t* codes = reinterpret_cast<const uint32_t*>(rA + kRawA);
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const int n = (t >> 3) + 16 * q;
          const uint32_t* w = codes + n * C::CW + c * (WB / 4);
          *reinterpret_cast<uint4*>(opB + sw128(n, c)) = dequant8<WB>(w, sb_cur[q]);
        }
#pragma unroll
        for (int q = 0; q < 16; ++q) sb_cur[q] = sb_nxt[q];
      }
      fence_proxy_async();  // the operand stores, before the tensor cores read them
      bar_arrive(op_full + 8 * os);
      bar_arrive(raw_empty + 8 * rs);
    }
  } else {
    // ---------------- consumers ----------------
    const int cw = wg - 1, warp = t >> 5, lane = t & 31;
    float acc[64];
    int i = 0;
    for (int u = 0; u < n_units; ++u) {
      const Unit un = unit(u);
      const int col0 = un.nb * kBN + cw * 128;
      const bool live_cols = col0 < a.out;  // uniform over the warpgroup
#pragma unroll
      for (int q = 0; q < 64; ++q) acc[q] = 0.f;
      for (int kt = 0; kt < nk; ++kt, ++i) {
        const int os = i % kOS;
        bar_wait(op_full + 8 * os, (i / kOS) & 1);
        __syncwarp();
        if (live_cols) {
          const uint32_t sa = smem_u32(op + os * kOpStage), sb = sa + kOpA + uint32_t(cw) * (kOpB / 2);
          const uint64_t da = desc_sw128(sa), db = desc_sw128(sb);
          fence_acc(acc);
          wg_fence();
#pragma unroll
          for (int k16 = 0; k16 < kBK / 16; ++k16) wgmma_n128(acc, da + 2 * k16, db + 2 * k16);  // +32 bytes per k16
          wg_commit();
          wg_wait_all();
          fence_acc(acc);
        }
        if (t == 0) bar_arrive(op_empty + 8 * os);
      }
      if (!live_cols) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + (lane >> 2) + 8 * h;
        if (r >= un.nrows) continue;
        float* yr = a.y + int64_t(un.row0 + r) * a.ldy;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int col = col0 + 8 * j + 2 * (lane & 3);
#pragma unroll
          for (int cc = 0; cc < 2; ++cc)
            if (col + cc < a.out) {
              const float v = acc[4 * j + 2 * h + cc];
              yr[col + cc] = a.accumulate ? yr[col + cc] + v : v;
            }
        }
      }
    }
  }
#else
  __trap();
#endif
}

// ---- host ------------------------------------------------------------------------------------
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
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

// A 3-D tiled tensor map (dims innermost first, strides of dims 1 and 2 in bytes, a box of b0 × b1 × 1).
bool make_map(CUtensorMap& m, CUtensorMapDataType dt, const void* base, uint64_t d0, uint64_t d1, uint64_t d2, uint64_t s1,
              uint64_t s2, uint32_t b0, uint32_t b1, CUtensorMapSwizzle sw) {
  const auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {s1, s2};
  const cuuint32_t box[3] = {b0, b1, 1}, es[3] = {1, 1, 1};
  return fn(&m, dt, 3, const_cast<void*>(base), dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

struct DevInfo {
  bool ok = false;
  int sms = 0;
};
// Per device (bit d of `raised`): the dynamic shared-memory limits, once; the device's fitness and SM count.
const DevInfo& dev_info() {
  static DevInfo info[64];
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  DevInfo& d = info[dev & 63];
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load() & bit) return d;
  cudaDeviceProp p{};
  LILY_CU(cudaGetDeviceProperties(&p, dev));
  cudaFuncAttributes fa{};
  const bool has90a = cudaFuncGetAttributes(&fa, gemm_wgmma_kernel<0>) == cudaSuccess && fa.binaryVersion >= 90;
  d.sms = p.multiProcessorCount;
  d.ok = p.major == 9 && p.minor == 0 && has90a && encode_fn() != nullptr &&
         size_t(p.sharedMemPerBlockOptin) >= Cfg<8>::SMEM;
  if (d.ok) {
    LILY_CU(cudaFuncSetAttribute(gemm_wgmma_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg<0>::SMEM)));
    LILY_CU(cudaFuncSetAttribute(gemm_wgmma_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg<4>::SMEM)));
    LILY_CU(cudaFuncSetAttribute(gemm_wgmma_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cfg<8>::SMEM)));
  }
  done.fetch_or(bit);
  return d;
}

}  // namespace

bool gemm_wgmma_takes(const Mat& W, int in, const float* x, int64_t ldx) {
  if (W.exl3 || in <= 0 || in % 8 != 0 || ldx % 4 != 0 || !aligned16(x)) return false;
  if (W.affine)
    return (W.bits == 4 || W.bits == 8) && W.gs >= 32 && W.gs % 32 == 0 && in % W.gs == 0 && W.row_words % 4 == 0 &&
           W.qstride % 4 == 0 && aligned16(W.q);
  return W.ld % 8 == 0 && W.estride % 8 == 0 && aligned16(W.w);
}

bool gemm_wgmma_device() { return dev_info().ok; }

void init_gemm_wgmma_kernels() { (void)dev_info(); }

bool gemm_wgmma(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s) {
  if (!gemm_wgmma_takes(W, in, x, ldx)) return false;
  const DevInfo& d = dev_info();
  if (!d.ok) return false;
  if (out <= 0 || max_tiles <= 0 || (!tiles && T <= 0)) return true;
  // experts of a stack: any index the tile map names (the map's extent is not checked against the stack)
  const uint64_t experts = tiles ? 65536 : 1;
  CUtensorMap map{};
  bool ok;
  if (!W.affine) {
    const uint64_t es = tiles ? uint64_t(W.estride) : uint64_t(out) * uint64_t(W.ld);
    ok = make_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, W.w, uint64_t(in), uint64_t(out), experts, uint64_t(W.ld) * 2,
                  std::max<uint64_t>(es, uint64_t(out) * uint64_t(W.ld)) * 2, kBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B);
  } else {
    const uint64_t qs = tiles ? uint64_t(W.qstride) : uint64_t(out) * uint64_t(W.row_words);
    ok = make_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT32, W.q, uint64_t(W.row_words), uint64_t(out), experts,
                  uint64_t(W.row_words) * 4, std::max<uint64_t>(qs, uint64_t(out) * uint64_t(W.row_words)) * 4,
                  uint32_t(W.bits * kBK / 32), kBN, CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if (!ok) return false;
  Args a{};
  a.out = out; a.in = in; a.x = x; a.ldx = ldx; a.gather = gather; a.y = y; a.ldy = ldy; a.accumulate = accumulate;
  a.tiles = tiles; a.n_tiles = n_tiles; a.T = T;
  a.s = W.s; a.b = W.b; a.sstride = W.sstride; a.gs = W.affine ? W.gs : 1; a.ngroups = W.affine ? in / W.gs : 0;
  const int64_t units = int64_t(tiles ? max_tiles : cdiv(T, kBM)) * cdiv(out, kBN);
  const unsigned grid = unsigned(std::min<int64_t>(units, d.sms));
  if (!W.affine)
    gemm_wgmma_kernel<0><<<grid, kThreads, Cfg<0>::SMEM, s>>>(map, a);
  else if (W.bits == 4)
    gemm_wgmma_kernel<4><<<grid, kThreads, Cfg<4>::SMEM, s>>>(map, a);
  else
    gemm_wgmma_kernel<8><<<grid, kThreads, Cfg<8>::SMEM, s>>>(map, a);
  LILY_CU_LAUNCH();
  return true;
}

}  // namespace lily::cuda
