// Hopper GEMM for prompt products on wgmma, fed by the copy engine, warp-specialised and persistent:
//   y[r, n] (= or +=) Σ_k a[r, k] · W_e[n, k],  16-bit operands (bf16, or fp16 with per-row scales), fp32
//   accumulation and output.
//
// The input rows are staged first (gemm_stage.h: fp32 -> bf16 or scaled fp16, gathered into product-row order,
// once per product), so the A operand is a plain [rows, in] matrix: one 2-D tensor-map box per stage.
// Work unit: one tile of <= 128 product rows (an entry of the tile map, or 128 dense rows) × 256 output columns.
// The CTAs (one per SM) walk the units persistently; unit w = (tile w / nblk, column block w % nblk), so the
// CTAs in flight share a tile's rows and an expert's weights (raster 1: the transpose). 384 threads:
//   warpgroup 0, the producer. Thread 0 issues each stage's copies S - 1 stages ahead: A (128 rows × 64, 128-byte
//     swizzle) and B (256 weight rows × 64, same swizzle: bf16 weights straight into the operand stage). When B
//     needs a transform (affine codes; bf16 weights in the fp16 mode; only with KernelSwitches::wgmma_rs off —
//     by default those products run on gemm_wgmma_rs.cu, which dequantises in the consumers' registers) it lands
//     raw and warps 1-3 turn it into the operand: s·q + b (q shifted into the mantissa of 1.0f: f = 1 + q·2^-bits,
//     s·q + b = fma(f, s·2^bits, b − s·2^bits)) into the swizzled layout, or bf16 -> fp16 in place.
//   warpgroups 1 and 2, the consumers: rows 0-63 and 64-127 of the unit, all 256 columns: 4 × wgmma
//     m64n256k16 per stage from shared memory, one group left in flight (the previous stage is released once
//     the next is issued); outputs written from registers (fp16: times the row's inverse scale).
// mbarriers per stage: full (the copies' bytes, and the transform warps' arrivals), empty (one arrival per
// consumer warp), raw (the raw copy, for the transform). Needs sm_90a; the sm_80 build of this file traps,
// and gemm_wgmma declines other devices.
#include "backend/cuda/gemm_wgmma.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/gemm_wgmma_rs.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/wgmma.cuh"

namespace lily::cuda {
namespace {

constexpr int kBM = wg::kUnitRows;  // rows per unit: two consumer warpgroups of 64
constexpr int kBN = wg::kUnitCols;  // columns per unit
constexpr int kBK = wg::kStageK;    // k per stage: one 128-byte swizzle row of 16-bit values
constexpr int kThreads = 384;
constexpr int kXformThreads = 96;   // producer warps 1-3
constexpr uint32_t kOpA = kBM * kBK * 2;  // 16 KB
constexpr uint32_t kOpB = kBN * kBK * 2;  // 32 KB
static_assert(kBM == 128 && kBM == kGemmUnitRows, "two consumer warpgroups of 64 rows; the tile maps' rows per unit");

// WB: 0 bf16 weights, 4 / 8 affine bits. F16: fp16 operands (else bf16).
template <int WB, bool F16>
struct Cfg {
  static constexpr bool XFORM = WB != 0 || F16;             // B is transformed by the producer's warps 1-3
  static constexpr int S = WB == 8 ? 3 : 4;                 // stages
  static constexpr int CW = WB * kBK / 32;                  // code words per row and stage
  static constexpr uint32_t RAW = uint32_t(kBN) * CW * 4;   // raw codes of a stage (0: none)
  static constexpr uint32_t STAGE = kOpA + kOpB + RAW;      // multiples of 1024: every operand 1024-aligned
  static constexpr size_t SMEM = 1024 + size_t(S) * STAGE + 8 * 3 * size_t(S);
  static constexpr int PREG = XFORM ? 56 : 40, CREG = XFORM ? 224 : 232;  // 128 · PREG + 256 · CREG <= 64 K
};

using wg::Args;

#ifdef LILY_WGMMA_CODE
using namespace wg;

// d (64 rows × 256 columns over the warpgroup; thread layout: rows 16·warp + lane/4 (+8), columns
// 8j + 2·(lane % 4) (+1) in d[4j .. 4j+3]) (scale_d: +)= A (64 × 16, descriptor da) · B (256 × 16, descriptor db)ᵀ.
#define LILY_WGMMA_N256(TY)                                                                                   \
  asm volatile("{\n"                                                                                           \
               ".reg .pred p;\n"                                                                               \
               "setp.ne.b32 p, %130, 0;\n"                                                                     \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " "                                   \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n"                                                \
               "}\n"                                                                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                                                                              \
               : "l"(da), "l"(db), "r"(scale_d))
template <bool F16>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (F16) LILY_WGMMA_N256("f16");
  else LILY_WGMMA_N256("bf16");
}
#undef LILY_WGMMA_N256
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
// Eight consecutive codes (one 16-byte output chunk) -> eight 16-bit values s·q + b; sb = scale | bias << 16.
template <int WB, bool F16>
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
  return make_uint4(pack2<F16>(v[0], v[1]), pack2<F16>(v[2], v[3]), pack2<F16>(v[4], v[5]), pack2<F16>(v[6], v[7]));
}

#endif

template <int WB, bool F16>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tmA,
                                                                 const __grid_constant__ CUtensorMap tmB, const Args a) {
#ifdef LILY_WGMMA_CODE
  using C = Cfg<WB, F16>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sm = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t base = smem_u32(sm);
  const uint32_t full = base + C::S * C::STAGE, empty = full + 8 * C::S, raw = empty + 8 * C::S;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  if (tid == 0) {
    for (int i = 0; i < C::S; ++i) {
      bar_init(full + 8 * i, 1 + (C::XFORM ? kXformThreads : 0));  // the copy thread (+ the transform threads)
      bar_init(empty + 8 * i, 8);                                   // one per consumer warp
      bar_init(raw + 8 * i, 1);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const UnitWalk unit(a.out, a.in, a.T, a.tiles, a.n_tiles, a.raster);
  const int nk = unit.nk, n_units = unit.n_units, n_stages = n_units * nk;
  auto opA = [&](int slot) { return base + uint32_t(slot) * C::STAGE; };
  auto opB = [&](int slot) { return base + uint32_t(slot) * C::STAGE + kOpA; };

  if (wg == 0) {
    // ---------------- producer ----------------
    reg_dealloc<C::PREG>();
    if (warp == 0) {
      if (lane == 0) {
        Unit un{};
        for (int j = 0; j < n_stages; ++j) {
          const int slot = j % C::S, kt = j % nk;
          if (kt == 0) un = unit(j / nk);
          bar_wait(empty + 8 * slot, ((j / C::S) & 1) ^ 1);
          const uint32_t f = full + 8 * slot;
          bar_arrive_tx(f, kOpA + (C::XFORM ? 0u : kOpB));
          tma_2d(opA(slot), &tmA, kt * kBK, un.row0, f);
          if constexpr (!C::XFORM) {
            tma_3d(opB(slot), &tmB, kt * kBK, un.nb * kBN, un.e, f);
          } else {
            const uint32_t r = raw + 8 * slot;
            bar_arrive_tx(r, WB ? C::RAW : kOpB);
            if constexpr (WB != 0) tma_3d(opB(slot) + kOpB, &tmB, kt * C::CW, un.nb * kBN, un.e, r);
            else tma_3d(opB(slot), &tmB, kt * kBK, un.nb * kBN, un.e, r);
          }
        }
      }
    } else if constexpr (C::XFORM) {
      const int t3 = tid - 32;
      Unit un{};
      for (int j = 0; j < n_stages; ++j) {
        const int slot = j % C::S, kt = j % nk;
        if (kt == 0) un = unit(j / nk);
        bar_wait(raw + 8 * slot, (j / C::S) & 1);
        unsigned char* b = sm + slot * C::STAGE + kOpA;
        if constexpr (WB == 0) {  // bf16 -> fp16, in place
          for (int idx = t3; idx < kBN * 8; idx += kXformThreads) {
            uint4* p = reinterpret_cast<uint4*>(b + sw128(idx >> 3, idx & 7));
            float v[8];
            bf8(*p, v);
            *p = make_uint4(pack2<true>(v[0], v[1]), pack2<true>(v[2], v[3]), pack2<true>(v[4], v[5]), pack2<true>(v[6], v[7]));
          }
        } else {
          const uint32_t* codes = reinterpret_cast<const uint32_t*>(b + kOpB);
          const int k0 = kt * kBK;
          const int64_t ebase = int64_t(un.e) * a.sstride;
          for (int idx = t3; idx < kBN * 8; idx += kXformThreads) {
            const int n = idx >> 3, c = idx & 7, col = un.nb * kBN + n, k = k0 + 8 * c;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (col < a.out && k < a.in) {
              const int64_t gi = ebase + int64_t(col) * a.ngroups + k / a.gs;
              const uint32_t sb = uint32_t(__ldg(a.s + gi)) | (uint32_t(__ldg(a.b + gi)) << 16);
              v = dequant8<WB, F16>(codes + n * C::CW + c * (WB / 4), sb);
            }
            *reinterpret_cast<uint4*>(b + sw128(n, c)) = v;
          }
        }
        fence_proxy_async();  // the operand stores, before the tensor cores read them
        bar_arrive(full + 8 * slot);
      }
    }
  } else {
    // ---------------- consumers ----------------
    reg_alloc<C::CREG>();
    const int cw = wg - 1;
    float acc[128];
#pragma unroll
    for (int q = 0; q < 128; ++q) acc[q] = 0.f;
    int j = 0;
    for (int u = 0; u < n_units; ++u) {
      const Unit un = unit(u);
      if (un.nrows <= 64 * cw) {  // no rows for this warpgroup (uniform over it): release the stages
        for (int kt = 0; kt < nk; ++kt, ++j) {
          const int slot = j % C::S;
          bar_wait(full + 8 * slot, (j / C::S) & 1);
          bar_arrive_if(empty + 8 * slot, lane == 0);
        }
        continue;
      }
      for (int kt = 0; kt < nk; ++kt, ++j) {
        const int slot = j % C::S;
        bar_wait(full + 8 * slot, (j / C::S) & 1);
        const uint64_t da = desc_sw128(opA(slot) + uint32_t(cw) * 64u * 128u), db = desc_sw128(opB(slot));
        fence_regs(acc);
        fence();
#pragma unroll
        for (int k16 = 0; k16 < kBK / 16; ++k16)  // +32 bytes per k16
          wgmma_n256<F16>(acc, da + 2 * k16, db + 2 * k16, (kt | k16) != 0);
        commit();
        wait<1>();  // the previous stage's group is done: release its slot
        fence_regs(acc);
        bar_arrive_if(empty + 8 * ((j + C::S - 1) % C::S), lane == 0 && kt > 0);
      }
      wait<0>();
      fence_regs(acc);
      bar_arrive_if(empty + 8 * ((j + C::S - 1) % C::S), lane == 0);
      // epilogue: rows 64·cw + 16·warp + lane/4 (+8), columns nb·256 + 8j + 2·(lane % 4) (+1)
      const bool vec = (a.ldy & 1) == 0 && (reinterpret_cast<uintptr_t>(a.y) & 7) == 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 64 * cw + 16 * warp + (lane >> 2) + 8 * h;
        if (r >= un.nrows) continue;
        const int row = un.row0 + r;
        float* yr = a.y + int64_t(row) * a.ldy;
        const float inv = F16 ? __frcp_rn(a.scales[row]) : 1.f;  // exact: a power of two
#pragma unroll
        for (int q = 0; q < 32; ++q) {
          const int col = un.nb * kBN + 8 * q + 2 * (lane & 3);
          float v0 = acc[4 * q + 2 * h] * inv, v1 = acc[4 * q + 2 * h + 1] * inv;
          if (vec && col + 1 < a.out) {
            float2* p = reinterpret_cast<float2*>(yr + col);
            if (a.accumulate) {
              const float2 o = *p;
              v0 += o.x;
              v1 += o.y;
            }
            *p = make_float2(v0, v1);
          } else {
            if (col < a.out) yr[col] = a.accumulate ? yr[col] + v0 : v0;
            if (col + 1 < a.out) yr[col + 1] = a.accumulate ? yr[col + 1] + v1 : v1;
          }
        }
      }
    }
  }
#else
  (void)Cfg<WB, F16>::XFORM;  // the sm_80 pass of this file compiles no body
  (void)Cfg<WB, F16>::PREG;
  (void)Cfg<WB, F16>::CREG;
  (void)kXformThreads;
  __trap();
#endif
}

// ---- host ----
template <int WB, bool F16>
void raise_smem() {
  LILY_CU(cudaFuncSetAttribute(gemm_wgmma_kernel<WB, F16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Cfg<WB, F16>::SMEM)));
}

struct DevInfo {
  bool ok = false;
  int sms = 0;
};
// Per device (bit d of `done`): the dynamic shared-memory limits, once; the device's fitness and SM count.
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
  const bool has90a = cudaFuncGetAttributes(&fa, gemm_wgmma_kernel<0, false>) == cudaSuccess && fa.binaryVersion >= 90;
  d.sms = p.multiProcessorCount;
  d.ok = p.major == 9 && p.minor == 0 && has90a && wg::encode_fn() != nullptr &&
         size_t(p.sharedMemPerBlockOptin) >= std::max({Cfg<0, false>::SMEM, Cfg<4, false>::SMEM, Cfg<8, false>::SMEM});
  if (d.ok) {
    raise_smem<0, false>(); raise_smem<4, false>(); raise_smem<8, false>();
    raise_smem<0, true>(); raise_smem<4, true>(); raise_smem<8, true>();
  }
  done.fetch_or(bit);
  return d;
}

template <int WB>
void launch(bool f16, unsigned grid, const CUtensorMap& ma, const CUtensorMap& mb, const Args& a, cudaStream_t s) {
  if (f16) gemm_wgmma_kernel<WB, true><<<grid, kThreads, Cfg<WB, true>::SMEM, s>>>(ma, mb, a);
  else gemm_wgmma_kernel<WB, false><<<grid, kThreads, Cfg<WB, false>::SMEM, s>>>(ma, mb, a);
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

bool gemm_wgmma_wanted(const Mat& W) {
  const int m = kernel_switches().gemm_wgmma;
  // auto: bf16 and affine 4-bit weights, 1.6-2.9x mma.sync in run 2 (bench/RESULTS.md); affine 8-bit not measured
  return m == kWgmmaOn || (m == kWgmmaAuto && !W.exl3 && (!W.affine || W.bits == 4));
}

void init_gemm_wgmma_kernels() {
  if (dev_info().ok) init_gemm_wgmma_rs_kernels();  // shared-memory limits before any capture
}

bool gemm_wgmma(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
                cudaStream_t s) {
  if (prec == GemmPrec::kSplit || !gemm_wgmma_takes(W, in, x, ldx)) return false;
  const DevInfo& d = dev_info();
  if (!d.ok) return false;
  if (out <= 0 || max_tiles <= 0 || T <= 0) return true;
  if (kernel_switches().wgmma_rs && gemm_wgmma_rs_covers(W, prec)) {
    gemm_wgmma_rs(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, prec, d.sms, s);
    return true;
  }
  const bool f16 = prec == GemmPrec::kFp16;
  const StagedRows st = stage_rows(f16, x, ldx, in, gather, tiles, n_tiles, max_tiles, T, s);
  CUtensorMap ma{}, mb{};
  const uint64_t da[2] = {uint64_t(in), uint64_t(T)}, sa[1] = {uint64_t(st.ld) * 2};
  bool ok = wg::make_map(ma, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, st.a, 2, da, sa, kBK,
                     kBM, CU_TENSOR_MAP_SWIZZLE_128B);
  // experts of a stack: any index the tile map names (the map's extent is not checked against the stack)
  const uint64_t experts = tiles ? 65536 : 1;
  if (!W.affine) {
    const uint64_t es = tiles ? uint64_t(W.estride) : uint64_t(out) * uint64_t(W.ld);
    const uint64_t db[3] = {uint64_t(in), uint64_t(out), experts};
    const uint64_t sb[2] = {uint64_t(W.ld) * 2, std::max<uint64_t>(es, uint64_t(out) * uint64_t(W.ld)) * 2};
    ok = ok && wg::make_map(mb, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, W.w, 3, db, sb, kBK, kBN, CU_TENSOR_MAP_SWIZZLE_128B);
  } else {
    const uint64_t qs = tiles ? uint64_t(W.qstride) : uint64_t(out) * uint64_t(W.row_words);
    const uint64_t db[3] = {uint64_t(W.row_words), uint64_t(out), experts};
    const uint64_t sb[2] = {uint64_t(W.row_words) * 4, std::max<uint64_t>(qs, uint64_t(out) * uint64_t(W.row_words)) * 4};
    ok = ok && wg::make_map(mb, CU_TENSOR_MAP_DATA_TYPE_UINT32, W.q, 3, db, sb, uint32_t(W.bits * kBK / 32), kBN,
                        CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if (!ok) fail_internal("gemm_wgmma: a tensor map of a covered shape was refused");
  Args a{};
  a.out = out; a.in = in; a.T = T; a.y = y; a.ldy = ldy; a.accumulate = accumulate;
  a.tiles = tiles; a.n_tiles = n_tiles; a.scales = st.s;
  a.s = W.s; a.b = W.b; a.sstride = W.sstride; a.gs = W.affine ? W.gs : 1; a.ngroups = W.affine ? in / W.gs : 0;
  a.raster = kernel_switches().wgmma_raster;
  const unsigned grid = wg::unit_grid(tiles ? max_tiles : 0, T, out, d.sms);
  if (!W.affine) launch<0>(f16, grid, ma, mb, a, s);
  else if (W.bits == 4) launch<4>(f16, grid, ma, mb, a, s);
  else launch<8>(f16, grid, ma, mb, a, s);
  LILY_CU_LAUNCH();
  return true;
}

}  // namespace lily::cuda
