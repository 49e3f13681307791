// Decode GEMV on MLX-affine 4/8-bit weights for one input row, fed by a ring of shared-memory stages
// that the Tensor Memory Accelerator fills (cp.async.bulk, completion counted on an mbarrier).
//
// At batch 1 a product streams 5-15 MB of weights. A warp-per-row kernel only has its registers' worth
// of loads in flight and waits on DRAM latency once per row tile; here one thread requests whole row
// tiles (16-24 KB, contiguous rows) S stages ahead, so each block keeps ~60 KB in flight and the next
// tile is resident when the warps finish the current one. Weights are never written by kernels, so
// plain products request their first stages before the programmatic-launch wait; expert products
// wait first (the ids come from the previous kernel).
//
// Dequantisation without int->float conversions (16 per clock per SM on Hopper: a ~2 TB/s ceiling for
// 4-bit codes): a code c shifted into the mantissa of 1.0f gives f = 1 + c·2^-m exactly, so
// Σ c·x = 2^m·(Σ f·x − Σ x), with Σ x per 16-byte column computed once per call. 4-bit: each nibble at
// mantissa bits 19-22 (m = 4); 8-bit: each byte at bits 15-22 (m = 8). c·2^-m is not small next to 1,
// so the subtraction cancels only a few bits. Per code: a shift, a mask-or, an FMA.
//
// Kinds: PLAIN y[x, r] (+)= W[r]·x_x for nx <= 4 input rows: each weight tile is read and dequantised once
// for all rows (decode steps of 2-4 rows: verification, a few streams); SWIGLU, per expert slot s:
// y[s, r] = silu(W_e[r]·x)·(W_e[I + r]·x) with x the row s / xdiv; CONCAT (MoE down projection and combine
// in one): y[g, r] (+)= Σ_{s of group g} w[s]·(W_{e_s}[r]·h_s), one virtual row per output spanning the expert
// rows of the group's slots (a group: the slots of one token of the step).
#include <atomic>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/affine_dot.cuh"
#include "backend/cuda/tma.cuh"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256, kWarps = 8;
constexpr int kMaxStages = 4;
// Two resident blocks per SM leave registers and shared memory for the next kernel's blocks to start
// beside them (PDL); three hide more dequantisation latency but block that (slower, bench/RESULTS.md).
constexpr int kBlocksPerSm = 2;
constexpr size_t kMaxSmem = 108 * 1024;
constexpr int kMaxSlots = 32;
constexpr int kMaxV = 8;  // float4 of input per thread: at most 8192 staged elements
constexpr int kMaxX = kGemvRingMaxRows;  // staged input rows (PLAIN rows, SWIGLU slot rows)
enum Kind { PLAIN = 0, SWIGLU = 1, CONCAT = 2 };

struct RingArgs {
  const uint8_t* q;     // codes of expert 0, row 0
  const uint16_t* s;    // scales (bf16), [experts][rows][ng]
  const uint16_t* b;    // biases (bf16)
  int64_t qstride_b;    // bytes between experts' codes
  int64_t row_b;        // bytes per row of codes
  int64_t sstride;      // elements between experts' scales
  int ng, gs, in, nrows, I, slots;
  int groups;           // CONCAT: output rows y + g·ldy, each summing slots/groups consecutive slots
  const int32_t* expert;
  const float* x;       // input row(s) at x + r·ldx (CONCAT: slot rows h_s at x + s·ldx)
  int64_t ldx;
  int nx;               // staged input rows: PLAIN output rows y + r·ldy; SWIGLU slot s reads row s / xdiv
  int xdiv;
  const float* xw;      // CONCAT: per-slot weights
  const float* norm_w;  // PLAIN / SWIGLU: RMSNorm of each input row first (weight), or null
  float eps;
  float* y;
  int64_t ldy;
  int accumulate;
  int tr;               // output rows per tile
  int ntiles, rtiles;   // tiles in all; tiles per slot (SWIGLU) or per group (CONCAT)
  int n;                // 16-byte columns per (virtual) row; CONCAT: of one group
  int nin;              // 16-byte columns per expert row
  int lpr;              // lanes per row: 32, 16 or 8
  uint32_t stage_bytes, codes_bytes, sc_bytes;  // stage size; its codes region; its scale region
  int stages;
  int xs_floats;        // staged input (padded to 32 columns)
  int ids_ready;        // CONCAT: the expert ids are complete when this kernel starts (see gemv_ring_concat)
};

// The ring needs sm_90 (bulk copies, transaction-counted mbarriers: tma.cuh). gemv_ring never launches it on
// older devices (ring_supported); their device code compiles these instructions to __trap().


// NX: PLAIN input rows computed together (1, 2 or 4; a.nx <= NX of them are real); 1 for the other kinds.
template <int BITS, int KIND, int RPW, int NX>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) gemv_ring_kernel(const RingArgs a) {
  static_assert(NX == 1 || KIND == PLAIN, "several rows per tile only for plain products");
  constexpr int C = 128 / BITS;
  constexpr int NACC = KIND == SWIGLU ? 2 * RPW : RPW;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bars[kMaxStages];
  __shared__ int ex[kMaxSlots];
  __shared__ float red[32];
  const int S = a.stages;
  float* xs = reinterpret_cast<float*>(smem + S * size_t(a.stage_bytes));
  float* colX = xs + a.nx * a.xs_floats;  // per input row and 16-byte column: Σ x, [nx][n]
  // SwiGLU slots let the next kernel start only once their own wait has returned: the expert ids (written
  // before this kernel's prerequisite finished) are then complete, and the MoE down product that follows
  // requests its experts' weights before its own wait.
  if constexpr (KIND != SWIGLU) allow_dependent_launch();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = gridDim.x, bid = blockIdx.x;
  const int my_tiles = bid < a.ntiles ? (a.ntiles - 1 - bid) / G + 1 : 0;
  const int64_t gb = int64_t(a.ng) * 2;  // bytes of scales per row

  // warp 0: local tile li -> stage li % S; lane 0 posts the byte count, the copies are spread over lanes
  auto issue = [&](int li) {
    const int t = bid + li * G;
    uint8_t* dst = smem + (li % S) * size_t(a.stage_bytes);
    uint64_t* bar = &bars[li % S];
    const uint8_t* sb = reinterpret_cast<const uint8_t*>(a.s);
    const uint8_t* bb = reinterpret_cast<const uint8_t*>(a.b);
    int r0, nv, parts;  // parts: row blocks copied (codes, scales, biases each)
    if constexpr (KIND == SWIGLU) {
      r0 = (t % a.rtiles) * a.tr; nv = min(a.tr, a.I - r0); parts = 2;
    } else {
      r0 = (KIND == CONCAT ? t % a.rtiles : t) * a.tr; nv = min(a.tr, a.nrows - r0);
      parts = KIND == CONCAT ? a.slots / a.groups : 1;
    }
    const uint32_t cb = uint32_t(nv * a.row_b), gbb = uint32_t(nv * gb);
    if (lane == 0) mbar_expect_tx(bar, uint32_t(parts) * (cb + 2 * gbb));
    __syncwarp();
    for (int c = lane; c < 3 * parts; c += 32) {
      const int part = c / 3, what = c % 3;
      int64_t e = 0, r = r0;
      if constexpr (KIND == SWIGLU) { e = ex[t / a.rtiles]; r += int64_t(part) * a.I; }  // gate rows, then up rows
      if constexpr (KIND == CONCAT) e = ex[(t / a.rtiles) * parts + part];
      if (what == 0) bulk_copy(dst + part * a.tr * a.row_b, a.q + e * a.qstride_b + r * a.row_b, cb, bar);
      else bulk_copy(dst + a.codes_bytes + (what - 1) * a.sc_bytes + part * a.tr * gb,
                     (what == 1 ? sb : bb) + e * a.sstride * 2 + r * gb, gbb, bar);
    }
  };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&bars[s], 1);
    mbar_init_fence();
    fence_proxy_async_smem();
  }
  __syncwarp();
  if constexpr (KIND == PLAIN) {
    if (warp == 0)
      for (int li = 0; li < min(S, my_tiles); ++li) issue(li);
    grid_dependency_wait();
  } else {
    const bool early = KIND == CONCAT && a.ids_ready;
    if (!early) grid_dependency_wait();
    if constexpr (KIND == SWIGLU) allow_dependent_launch();
    if (warp == 0) {
      if (lane < a.slots) ex[lane] = a.expert[lane];
      __syncwarp();
      for (int li = 0; li < min(S, my_tiles); ++li) issue(li);
    }
    if (early) grid_dependency_wait();
  }

  // ---- stage the input (PLAIN / SWIGLU: RMS-normalised when asked; CONCAT: w[s]·h_s of every slot) and Σ x
  // per column. Every load of a pass is issued before the first is used (one L2 round trip per pass of 8192
  // elements; rows of PLAIN and SWIGLU are one pass): thread (warp, lane) holds float4 m at elements
  // base + 1024·m + 128·warp + 4·lane; the lanes sharing a column sum by shuffles (8 lanes per 4-bit column,
  // 4 per 8-bit one). ----
  const int nel = KIND == CONCAT ? a.slots * a.in : a.in;
  auto stage_row = [&](const float* xrow, float* xsr, float* cxr, int base) {
    float4 v[kMaxV];
#pragma unroll
    for (int m = 0; m < kMaxV; ++m) {
      const int e = base + 1024 * m + 128 * warp + 4 * lane;
      v[m] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (e < nel) {
        if constexpr (KIND == CONCAT) {
          const int sl = e / a.in;
          const float4 h = *reinterpret_cast<const float4*>(a.x + sl * a.ldx + (e - sl * a.in));
          const float w = a.xw[sl];
          v[m] = make_float4(w * h.x, w * h.y, w * h.z, w * h.w);
        } else {
          v[m] = *reinterpret_cast<const float4*>(xrow + e);
        }
      }
    }
    if (KIND != CONCAT && a.norm_w) {
      float ss = 0.f;
#pragma unroll
      for (int m = 0; m < kMaxV; ++m) ss += v[m].x * v[m].x + v[m].y * v[m].y + v[m].z * v[m].z + v[m].w * v[m].w;
      const float inv = rsqrtf(block_sum(ss, red) / float(nel) + a.eps);
#pragma unroll
      for (int m = 0; m < kMaxV; ++m) {
        const int e = base + 1024 * m + 128 * warp + 4 * lane;
        if (e < nel) {
          const float4 w = *reinterpret_cast<const float4*>(a.norm_w + e);
          v[m] = make_float4(v[m].x * inv * w.x, v[m].y * inv * w.y, v[m].z * inv * w.z, v[m].w * inv * w.w);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kMaxV; ++m) {
      const int e0 = base + 1024 * m + 128 * warp;
      if (e0 < nel) {  // nel % 128 == 0: a warp's 128 elements are all in or all out
        const int e = e0 + 4 * lane;
        *reinterpret_cast<float4*>(xsr + xs_at<BITS>(e)) = v[m];
        float t = v[m].x + v[m].y + v[m].z + v[m].w;
#pragma unroll
        for (int o = C / 8; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane % (C / 4) == 0) cxr[e / C] = t;
      }
    }
  };
  if constexpr (KIND == CONCAT) {
    for (int base = 0; base < nel; base += kMaxV * 4 * kThreads) stage_row(a.x, xs, colX, base);
  } else {
    for (int xr = 0; xr < a.nx; ++xr) stage_row(a.x + xr * a.ldx, xs + xr * a.xs_floats, colX + xr * a.n, 0);
  }
  __syncthreads();

  // ---- tiles ----
  const int lpr = a.lpr, sub = lane / lpr, sl = lane % lpr, nsub = 32 / lpr;
  const int rfirst = (warp * nsub + sub) * RPW;  // this lane's first row within a tile
  for (int li = 0; li < my_tiles; ++li) {
    const int t = bid + li * G;
    const uint8_t* st = smem + (li % S) * size_t(a.stage_bytes);
    const uint16_t* ss = reinterpret_cast<const uint16_t*>(st + a.codes_bytes);
    const uint16_t* bs = reinterpret_cast<const uint16_t*>(st + a.codes_bytes + a.sc_bytes);
    mbar_wait(&bars[li % S], uint32_t(li / S) & 1u);
    if constexpr (NX > 1) {
      float acc[NX][RPW];
#pragma unroll
      for (int r = 0; r < NX; ++r)
#pragma unroll
        for (int j = 0; j < RPW; ++j) acc[r][j] = 0.f;
      for (int i = sl; i < a.n; i += lpr) {
        const int g = (i * C) / a.gs;
        uint4 w[RPW];
        float sc[RPW], bi[RPW];
#pragma unroll
        for (int j = 0; j < RPW; ++j) {
          const int srow = rfirst + j;
          w[j] = *reinterpret_cast<const uint4*>(st + srow * a.row_b + i * 16);
          sc[j] = bf(ss[srow * a.ng + g]);
          bi[j] = bf(bs[srow * a.ng + g]);
        }
#pragma unroll
        for (int r = 0; r < NX; ++r) {
          if (r >= a.nx) break;
          float xv[C];
          const float4* x4 = reinterpret_cast<const float4*>(xs + r * a.xs_floats) + (i >> 5) * 8 * C + (i & 31);
#pragma unroll
          for (int k = 0; k < C / 4; ++k) {
            const float4 v = x4[k * 32];
            xv[4 * k] = v.x; xv[4 * k + 1] = v.y; xv[4 * k + 2] = v.z; xv[4 * k + 3] = v.w;
          }
          const float cx = colX[r * a.n + i], ck = kColScale<BITS> * cx;
#pragma unroll
          for (int j = 0; j < RPW; ++j) acc[r][j] = fmaf(sc[j], col_dot<BITS>(w[j], xv) - ck, fmaf(bi[j], cx, acc[r][j]));
        }
      }
#pragma unroll
      for (int r = 0; r < NX; ++r)
#pragma unroll
        for (int j = 0; j < RPW; ++j)
          for (int o = lpr >> 1; o > 0; o >>= 1) acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
      if (sl == 0) {
#pragma unroll
        for (int r = 0; r < NX; ++r) {
          if (r >= a.nx) break;
          float* yr = a.y + r * a.ldy;
#pragma unroll
          for (int j = 0; j < RPW; ++j) {
            const int row = t * a.tr + rfirst + j;
            if (row < a.nrows) yr[row] = a.accumulate ? yr[row] + acc[r][j] : acc[r][j];
          }
        }
      }
    } else {
      // SWIGLU: the slot's input row; CONCAT: the group's columns of the staged slots
      const int xr0 = KIND == SWIGLU ? (t / a.rtiles) / a.xdiv : 0;
      const int g = KIND == CONCAT ? t / a.rtiles : 0;
      const float* cx0 = colX + xr0 * a.n + g * a.n;
      float acc[NACC];
#pragma unroll
      for (int j = 0; j < NACC; ++j) acc[j] = 0.f;
      for (int i = sl; i < a.n; i += lpr) {
        float xv[C];
        const int ix = g * a.n + i;  // staged column
        const float4* x4 = reinterpret_cast<const float4*>(xs + xr0 * a.xs_floats) + (ix >> 5) * 8 * C + (ix & 31);
#pragma unroll
        for (int k = 0; k < C / 4; ++k) {
          const float4 v = x4[k * 32];
          xv[4 * k] = v.x; xv[4 * k + 1] = v.y; xv[4 * k + 2] = v.z; xv[4 * k + 3] = v.w;
        }
        const float cx = cx0[i], ck = kColScale<BITS> * cx;
        // stage row of (row j, column i): CONCAT rows of slot s sit at s·tr, SWIGLU up rows at tr
        int srow0 = rfirst, col = i;
        if constexpr (KIND == CONCAT) {
          const int s = i / a.nin;
          srow0 += s * a.tr;
          col = i - s * a.nin;
        }
        const int grp = (col * C) / a.gs;
#pragma unroll
        for (int j = 0; j < NACC; ++j) {
          const int srow = srow0 + (KIND == SWIGLU && j >= RPW ? a.tr + j - RPW : j);
          const uint4 w = *reinterpret_cast<const uint4*>(st + srow * a.row_b + col * 16);
          const float sc = bf(ss[srow * a.ng + grp]), bi = bf(bs[srow * a.ng + grp]);
          acc[j] = fmaf(sc, col_dot<BITS>(w, xv) - ck, fmaf(bi, cx, acc[j]));
        }
      }
#pragma unroll
      for (int j = 0; j < NACC; ++j)
        for (int o = lpr >> 1; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
      if (sl == 0) {
#pragma unroll
        for (int j = 0; j < RPW; ++j) {
          if constexpr (KIND == SWIGLU) {
            const int slot = t / a.rtiles, r = (t % a.rtiles) * a.tr + rfirst + j;
            if (r < a.I) a.y[slot * a.ldy + r] = silu(acc[j]) * acc[RPW + j];
          } else if constexpr (KIND == CONCAT) {
            const int r = (t % a.rtiles) * a.tr + rfirst + j;
            float* yg = a.y + g * a.ldy;
            if (r < a.nrows) yg[r] = a.accumulate ? yg[r] + acc[j] : acc[j];
          } else {
            const int r = t * a.tr + rfirst + j;
            if (r < a.nrows) a.y[r] = a.accumulate ? a.y[r] + acc[j] : acc[j];
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage
    if (warp == 0 && li + S < my_tiles) {
      fence_proxy_async_smem();
      issue(li + S);
    }
  }
}

bool ring_supported() {
  return device_cc_major() >= 9 && kernel_switches().gemv_ring;  // cp.async.bulk and mbarrier transaction counts
}

template <int BITS, int KIND, int RPW, int NX>
void launch_ring(const RingArgs& a, int grid, size_t smem, cudaStream_t s) {
  static const bool attr = [smem] {
    LILY_CU(cudaFuncSetAttribute(gemv_ring_kernel<BITS, KIND, RPW, NX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kMaxSmem)));
    (void)smem;
    return true;
  }();
  (void)attr;
  PdlLaunch L(dim3(unsigned(grid)), dim3(kThreads), smem, s);
  LILY_CU(cudaLaunchKernelEx(&L.cfg, gemv_ring_kernel<BITS, KIND, RPW, NX>, a));
  LILY_CU_LAUNCH();
}

template <int KIND, int RPW, int NX>
void launch_bits(int bits, const RingArgs& a, int grid, size_t smem, cudaStream_t s) {
  if (bits == 4) launch_ring<4, KIND, RPW, NX>(a, grid, smem, s);
  else launch_ring<8, KIND, RPW, NX>(a, grid, smem, s);
}

// Tiles, stages and shared memory of one product (host only). rows: output rows (PLAIN, CONCAT) or I
// (SWIGLU); nx: staged input rows (PLAIN rows, SWIGLU slot rows); groups: CONCAT output rows (slots / groups
// slots each). ok == false: not covered (a bulk copy would not be whole 16-byte units, the input does not fit
// the staging registers, or one stage does not fit the shared memory).
struct Shape {
  bool ok = false;
  int rpw = 1, tr = 0, lpr = 32, nin = 0, n = 0, stages = 0, ntiles = 0, rtiles = 0, xs_floats = 0, grid = 0;
  uint32_t codes_bytes = 0, sc_bytes = 0, stage_bytes = 0;
  size_t smem = 0;
};

Shape ring_shape(int kind, int bits, int gs, int in, int rows, int slots, int sms, int nx, int groups) {
  Shape h;
  if ((bits != 4 && bits != 8) || gs <= 0 || gs % 32 != 0 || in <= 0 || in % 128 != 0 || in % gs != 0 || rows <= 0 ||
      slots <= 0 || slots > kMaxSlots || nx < 1 || nx > kMaxX || (kind == CONCAT && nx != 1) || groups < 1 ||
      (kind != CONCAT && groups != 1) || slots % groups != 0)
    return h;
  const int C = 128 / bits;
  const int64_t row_b = int64_t(in) * bits / 8, gb = int64_t(in / gs) * 2;
  const int kk = slots / groups;  // CONCAT: slots per group
  h.nin = in / C;
  h.n = kind == CONCAT ? kk * h.nin : h.nin;
  h.lpr = h.nin >= 32 || kind == CONCAT ? 32 : h.nin >= 16 ? 16 : 8;
  const int nsub = 32 / h.lpr;
  const int parts = kind == SWIGLU ? 2 : kind == CONCAT ? kk : 1;  // row blocks per tile
  const int64_t per_row = (row_b + 2 * gb) * parts;
  const int64_t units = kind == SWIGLU ? int64_t(slots) * rows : int64_t(groups) * rows;
  const int staged = kind == CONCAT ? groups * h.n : h.n;  // staged 16-byte columns per input row
  h.xs_floats = int(cdiv(staged, 32)) * 32 * C;
  const size_t fixed = sizeof(float) * size_t(nx) * (size_t(h.xs_floats) + size_t(staged));  // staged rows, Σ x
  // a stage of at most 24 KB, and two of them beside the staged rows when there are several
  const int64_t stage_cap = nx > 1 ? std::min<int64_t>(24 * 1024, (int64_t(kMaxSmem) - int64_t(fixed)) / 2 - 128) : 24 * 1024;
  h.rpw = 4;
  while (h.rpw > 1 && (int64_t(kWarps) * nsub * h.rpw * per_row > stage_cap || units / (kWarps * nsub * h.rpw) < 2 * sms))
    h.rpw /= 2;
  h.tr = kWarps * nsub * h.rpw;
  auto a16 = [](int64_t v) { return v % 16 == 0; };
  const int64_t nv_last = rows % h.tr == 0 ? h.tr : rows % h.tr;
  if (!a16(row_b) || !a16(h.tr * gb) || !a16(nv_last * gb)) return h;
  if (kind == SWIGLU && !a16(int64_t(rows) * gb)) return h;  // up rows start I rows in
  if (kind != CONCAT && in > kMaxV * 4 * kThreads) return h;  // one staging pass (CONCAT stages in passes)
  h.codes_bytes = uint32_t(int64_t(h.tr) * parts * row_b);
  h.sc_bytes = uint32_t(int64_t(h.tr) * parts * gb);
  h.stage_bytes = uint32_t((h.codes_bytes + 2 * h.sc_bytes + 127) / 128 * 128);
  h.rtiles = kind == PLAIN ? 0 : int(cdiv(rows, h.tr));
  h.ntiles = kind == SWIGLU ? slots * h.rtiles : kind == CONCAT ? groups * h.rtiles : int(cdiv(rows, h.tr));
  h.stages = kMaxStages;
  while (h.stages > 1 && size_t(h.stages) * h.stage_bytes + fixed > kMaxSmem) --h.stages;
  if (nx > 1 && h.stages < 2) return h;  // one stage cannot overlap the copies with the rows' products
  h.smem = size_t(h.stages) * h.stage_bytes + fixed;
  if (h.smem > kMaxSmem) return h;
  h.grid = int(std::min<int64_t>(h.ntiles, kBlocksPerSm * int64_t(sms)));
  h.ok = true;
  return h;
}

// Fills the shape fields of a and launches; false when the product is not covered (nothing launched).
bool plan_and_launch(const Mat& W, RingArgs& a, int kind, cudaStream_t s) {
  const Shape h =
      ring_shape(kind, W.bits, W.gs, a.in, kind == SWIGLU ? a.I : a.nrows, a.slots, device_sm_count(), a.nx, a.groups);
  if (!h.ok) return false;
  // every bulk copy starts at a 16-byte aligned address; the input is read as float4
  if (a.qstride_b % 16 != 0 || (a.sstride * 2) % 16 != 0 || !aligned16(a.q) || !aligned16(a.s) || !aligned16(a.b) ||
      !aligned16(a.x) || a.ldx % 4 != 0 || (a.norm_w && !aligned16(a.norm_w)))
    return false;
  a.nin = h.nin; a.n = h.n; a.lpr = h.lpr; a.tr = h.tr;
  a.codes_bytes = h.codes_bytes; a.sc_bytes = h.sc_bytes; a.stage_bytes = h.stage_bytes;
  a.rtiles = h.rtiles; a.ntiles = h.ntiles; a.xs_floats = h.xs_floats; a.stages = h.stages;
  auto go = [&](auto kind_c, auto nx_c) {
    constexpr int K = decltype(kind_c)::value, NX = decltype(nx_c)::value;
    if (h.rpw == 4) launch_bits<K, 4, NX>(W.bits, a, h.grid, h.smem, s);
    else if (h.rpw == 2) launch_bits<K, 2, NX>(W.bits, a, h.grid, h.smem, s);
    else launch_bits<K, 1, NX>(W.bits, a, h.grid, h.smem, s);
  };
  using One = std::integral_constant<int, 1>;
  if (kind == PLAIN && a.nx > 2) go(std::integral_constant<int, PLAIN>{}, std::integral_constant<int, 4>{});
  else if (kind == PLAIN && a.nx == 2) go(std::integral_constant<int, PLAIN>{}, std::integral_constant<int, 2>{});
  else if (kind == PLAIN) go(std::integral_constant<int, PLAIN>{}, One{});
  else if (kind == SWIGLU) go(std::integral_constant<int, SWIGLU>{}, One{});
  else go(std::integral_constant<int, CONCAT>{}, One{});
  return true;
}

RingArgs base_args(const Mat& W, int in) {
  RingArgs a{};
  a.q = reinterpret_cast<const uint8_t*>(W.q);
  a.s = W.s;
  a.b = W.b;
  a.qstride_b = W.qstride * 4;
  a.row_b = W.row_words * 4;
  a.sstride = W.sstride;
  a.gs = W.gs;
  a.ng = in / W.gs;
  a.in = in;
  a.nx = 1;
  a.xdiv = 1;
  a.groups = 1;
  return a;
}


// Steps of `rows` rows (input rows, or tokens of the down + combine) on the ring: one row always, more from
// KernelSwitches::ring_rows_min.
bool rows_on(int rows) {
  const int m = kernel_switches().ring_rows_min;
  return rows <= 1 || (m > 0 && rows >= m && rows <= kMaxX);
}

bool covered(const Mat& W, int in) {
  return ring_supported() && W.affine && !W.exl3 && (W.bits == 4 || W.bits == 8) && W.q && W.s && W.b && in % 32 == 0 &&
         W.gs % 32 == 0 && in % W.gs == 0 && W.row_words * 4 * 8 == int64_t(in) * W.bits;
}

}  // namespace


GemvRingPlan gemv_ring_plan(int kind, int bits, int gs, int in, int rows, int slots, int sm_count, int nx, int groups) {
  const Shape h = ring_shape(kind, bits, gs, in, rows, slots, sm_count, nx, groups);
  return GemvRingPlan{h.ok, h.tr, h.stages, h.ntiles, h.grid, h.smem};
}

bool gemv_ring(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
               float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps) {
  if (!covered(W, in) || slots <= 0 || xdiv <= 0) return false;
  const bool swi = swiglu_I > 0;
  if (swi != (expert != nullptr) || slots > kMaxSlots) return false;
  if (accumulate && swi) return false;
  // input rows: PLAIN one per output row (xdiv 1), SWIGLU one per xdiv slots
  const int nx = swi ? int(cdiv(slots, xdiv)) : slots;
  if (nx > kMaxX || !rows_on(nx) || (!swi && xdiv != 1 && slots > 1)) return false;
  if (swi && nx > kernel_switches().ring_moe_rows) return false;
  if ((swi ? swiglu_I : out) <= 0) return true;  // nothing to compute
  RingArgs a = base_args(W, in);
  a.nrows = swi ? swiglu_I : out;
  a.I = swiglu_I;
  a.slots = swi ? slots : 1;
  a.nx = nx;
  a.xdiv = swi ? xdiv : 1;
  a.ldx = ldx;
  a.expert = expert;
  a.x = x;
  a.norm_w = norm_w;
  a.eps = eps;
  a.y = y;
  a.ldy = ldy;
  a.accumulate = accumulate;
  return plan_and_launch(W, a, swi ? SWIGLU : PLAIN, s);
}

bool gemv_ring_concat(const Mat& W, const int32_t* expert, int out, int in, const float* h, int64_t ldh,
                      const float* weights, int slots, int groups, float* y, int64_t ldy, bool accumulate, cudaStream_t s,
                      bool ids_ready) {
  if (!covered(W, in) || slots <= 0 || slots > kMaxSlots || !expert || groups < 1 || slots % groups != 0 ||
      !rows_on(groups) || groups > kernel_switches().ring_moe_rows)
    return false;
  if (out <= 0) return true;
  RingArgs a = base_args(W, in);
  a.nrows = out;
  a.slots = slots;
  a.groups = groups;
  a.expert = expert;
  a.x = h;
  a.ldx = ldh;
  a.xw = weights;
  a.y = y;
  a.ldy = ldy;
  a.accumulate = accumulate;
  a.ids_ready = ids_ready ? 1 : 0;
  return plan_and_launch(W, a, CONCAT, s);
}

}  // namespace lily::cuda
