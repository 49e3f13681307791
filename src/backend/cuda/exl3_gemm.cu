// EXL3 prompt products (see exl3.cu for the tile decode and the GEMV).
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
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <mutex>

#include "backend/cuda/device_info.h"
#include "backend/cuda/exl3_tile.cuh"
#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rows.h"

namespace lily::cuda {
namespace {

constexpr int kGmRows = kGemmBM;  // GEMM rows per tile (the MoE tile map's granularity)
constexpr int kAStride = 136;     // halves per staged GEMM input row (conflict-free fragment loads)
constexpr int kCStride = 132;     // floats per staged GEMM output row

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
  int e, row0, nrows;
  if (!tile_rows(tiles, n_tiles, tile, T, kGmRows, e, row0, nrows)) return;
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

}  // namespace

void init_exl3_gemm_kernels() {
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb)
      dispatch(K, cb, [&](auto kc, auto cc) {
        constexpr int k = decltype(kc)::value, c = decltype(cc)::value;
        LILY_CU(cudaFuncSetAttribute(exl3_gemm_kernel<k, c, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(gemm_smem<k>())));
        LILY_CU(cudaFuncSetAttribute(exl3_gemm_kernel<k, c, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(gemm_smem<k>())));
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
