// MoE block on the device: router, top-k with softmax over the selected experts, expert SwiGLU MLPs,
// shared expert with its sigmoid gate, weighted combine into the residual. No host synchronisation:
// decode (T <= KernelSwitches::moe_gemv_rows) runs one GEMV slot per (token, choice); prompts sort the (token, choice)
// slots by expert on the device (histogram, prefix scan, scatter, tile map) and run the tiled GEMM over
// a tile list whose live length is read on the device. Steps of 2..rows_moe rows (KernelSwitches) take the same
// sort with tiles of kRowsTile rows into the multi-row products (gemv_rows.cu): each chosen expert is read
// once per tile, SwiGLU fused into the gate‖up product.
#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/gemm_wgmma.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/rows.h"

namespace lily::cuda {
namespace {

// T <= this: one GEMV slot per (token, choice) (KernelSwitches::moe_gemv_rows)
int moe_gemv_rows() { return kernel_switches().moe_gemv_rows; }

// The MoE down product requests its experts' weights before its programmatic-launch wait when the
// gate‖up product ran on the ring (KernelSwitches::ring_early_ids off: after it).
bool ring_early_ids() { return kernel_switches().ring_early_ids; }

struct MoeScratch {
  float *logits, *w, *gu, *h, *yb, *sh_gu, *sh_h, *ysh, *sg;
  int32_t *idx, *slot_pos, *sorted_tok, *tiles, *n_tiles, *counts;
  size_t bytes;
};

// Whether gemm_tiles would run W on the wgmma kernel (which then takes tiles of kGemmUnitRows rows).
bool wgmma_covers(const Mat& W, int in, const float* x, int64_t ldx) {
  return gemm_wgmma_wanted(W) && gemm_prec_for(W) != GemmPrec::kSplit && gemm_wgmma_takes(W, in, x, ldx) &&
         gemm_wgmma_device();
}

// Tiles of at most tile_rows slots: one per expert plus the full ones.
int max_tiles_for(const MoeDev& m, int T, int tile_rows) {
  return int(cdiv(int64_t(T) * m.slots_per_token(), tile_rows)) + m.E + (m.shared_in_stack ? 1 : 0);
}

MoeScratch layout(const MoeDev& m, int T, void* base) {
  MoeScratch s{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* r = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return r; };
  const size_t n = size_t(T) * size_t(m.slots_per_token());
  s.logits = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * (m.E + 1)));
  s.w = reinterpret_cast<float*>(take(sizeof(float) * n));
  s.idx = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.slot_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.sorted_tok = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * 3 * size_t(max_tiles_for(m, T, kRowsTile))));
  s.n_tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  s.counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(m.E + 2)));
  s.gu = reinterpret_cast<float*>(take(sizeof(float) * n * 2 * m.I));
  s.h = reinterpret_cast<float*>(take(sizeof(float) * n * m.I));
  s.yb = reinterpret_cast<float*>(take(sizeof(float) * n * m.H));
  s.sh_gu = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * 2 * m.Is));
  s.sh_h = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * m.Is));
  s.ysh = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * m.H));
  s.sg = reinterpret_cast<float*>(take(sizeof(float) * size_t(T)));
  s.bytes = off;
  return s;
}

// One warp per token: top-k of the router logits and their routing weights (topk_warp).
__global__ void topk_kernel(const float* __restrict__ logits, int64_t ld, TopkArgs a) {
  pdl_entry();
  topk_warp(logits + int64_t(blockIdx.x) * ld, blockIdx.x, a);
}

// One block of 1024 threads (E <= 1024): expert histogram, prefix scan over experts (thread e owns expert e),
// tile map (tiles of at most tile_rows slots), scatter of slots into expert order.
__global__ void __launch_bounds__(1024) route_kernel(const int32_t* __restrict__ idx, int n, int E, int k, int tile_rows,
                                                     int32_t* __restrict__ counts, int32_t* __restrict__ slot_pos,
                                                     int32_t* __restrict__ sorted_tok, int32_t* __restrict__ tiles,
                                                     int32_t* __restrict__ n_tiles) {
  extern __shared__ int sh[];  // cnt[E], off[E], fill[E]
  __shared__ int wsum[32][2];  // per-warp totals of (slots, tiles)
  int* cnt = sh;
  int* off = sh + E;
  int* fill = sh + 2 * E;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  for (int e = tid; e < E; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
  __syncthreads();
  for (int s = tid; s < n; s += blockDim.x) atomicAdd(&cnt[idx[s]], 1);
  __syncthreads();
  const int c = tid < E ? cnt[tid] : 0;
  const int nt = (c + tile_rows - 1) / tile_rows;
  int cs = c, ts = nt;  // inclusive warp scans
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, cs, o), b2 = __shfl_up_sync(0xffffffffu, ts, o);
    if (lane >= o) { cs += a; ts += b2; }
  }
  if (lane == 31) { wsum[w][0] = cs; wsum[w][1] = ts; }
  __syncthreads();
  int cb = 0, tb = 0, ctot = 0, ttot = 0;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) {
    if (i < w) { cb += wsum[i][0]; tb += wsum[i][1]; }
    ctot += wsum[i][0];
    ttot += wsum[i][1];
  }
  if (tid < E) {
    const int o = cb + cs - c, t0 = tb + ts - nt;  // exclusive offsets of expert tid
    off[tid] = o;
    counts[tid] = c;
    for (int i = 0; i < nt; ++i) {
      const int t = t0 + i;
      tiles[3 * t] = tid;
      tiles[3 * t + 1] = o + i * tile_rows;
      tiles[3 * t + 2] = min(tile_rows, c - i * tile_rows);
    }
  }
  if (tid == 0) {
    counts[E] = ctot;
    *n_tiles = ttot;
  }
  __syncthreads();
  for (int s = tid; s < n; s += blockDim.x) {
    const int e = idx[s];
    const int p = off[e] + atomicAdd(&fill[e], 1);
    slot_pos[s] = p;
    sorted_tok[p] = s / k;
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gu, int I, int64_t rows, float* __restrict__ h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * I) return;
  const int64_t r = i / I, c = i % I;
  h[i] = silu(gu[r * 2 * I + c]) * gu[r * 2 * I + I + c];
}

// x[t] += sum_j w[t,j] · yb[slot_pos(t,j)] + gate(t) · ysh[t]; grid (H / 128, T), one element per thread
// so that the k slot loads of a thread are in flight together.
__global__ void combine_kernel(float* __restrict__ x, int H, int k, const float* __restrict__ w,
                               const int32_t* __restrict__ slot_pos, const float* __restrict__ yb,
                               const float* __restrict__ ysh, const float* __restrict__ sg, int sg_ld) {
  pdl_entry();
  const int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H) return;
  float* xr = x + int64_t(t) * H;
  float acc = xr[i];
#pragma unroll 8
  for (int j = 0; j < k; ++j) {
    const int s = t * k + j;
    const int p = slot_pos ? slot_pos[s] : s;
    acc += w[s] * yb[int64_t(p) * H + i];
  }
  if (ysh) acc += (sg ? sigmoid(sg[int64_t(t) * sg_ld]) : 1.f) * ysh[int64_t(t) * H + i];
  xr[i] = acc;
}

// gate‖up of a SwiGLU MLP (the shared expert, or the dense MLP) into sc.sh_h: the multi-row product for
// rows_min..rows_dense rows, GEMVs with the SwiGLU fused up to gemv_max rows (id: the
// expert id of a one-row affine GEMV, or null), else the GEMM and the swiglu kernel.
void swiglu_gate_up(const MoeDev& m, const float* u, int T, const MoeScratch& sc, cudaStream_t s, const float* nw,
                    float eps, const int32_t* id, int gemv_max) {
  const int H = m.H;
  if (rows_linear(m.sh_gate_up, 0, H, u, H, T, sc.sh_h, m.Is, false, m.Is, s, nw, eps)) return;
  if (T <= gemv_max) {
    gemv_slots(m.sh_gate_up, id, 0, H, u, H, 1, T, sc.sh_h, m.Is, false, m.Is, s, nw, eps);
    return;
  }
  linear(m.sh_gate_up, 2 * m.Is, H, u, H, T, sc.sh_gu, 2 * m.Is, false, s);
  swiglu_kernel<<<cdiv(int64_t(T) * m.Is, 256), 256, 0, s>>>(sc.sh_gu, m.Is, T, sc.sh_h);
  LILY_CU_LAUNCH();
}

// The dense SwiGLU MLP (moe == false) through the shared expert's products, GEMVs up to linear()'s GEMV row
// count (one-row affine steps with expert id 0, so the ring's SwiGLU product takes them), then the down
// projection accumulated straight into the residual. Row-wise: the rows may belong to different sequences.
void dense_mlp(const MoeDev& m, const float* u, int T, float* x, const MoeScratch& sc, cudaStream_t s,
               const float* nw, float eps) {
  const int32_t* id = T == 1 && m.sh_gate_up.affine ? m.zero_id : nullptr;
  swiglu_gate_up(m, u, T, sc, s, nw, eps, id, std::max(kGemvMaxRows, kernel_switches().gemv_rows));
  linear(m.sh_down, m.H, m.Is, sc.sh_h, m.Is, T, x, m.H, true, s);
}

}  // namespace

size_t moe_scratch_bytes(const MoeDev& m, int T) { return layout(m, T, nullptr).bytes; }

void moe(const MoeDev& m, const float* u, int T, float* x, void* scratch, cudaStream_t main_stream,
         cudaStream_t side, cudaEvent_t fork, cudaEvent_t join, const float* norm_w, float eps) {
  if (T <= 0) return;
  const bool fused = u == nullptr;  // GEMVs normalise x themselves
  if (fused && (T > norm_fuse_rows() || !norm_w)) fail_internal("moe: fused RMSNorm needs T <= norm_rows and a norm weight");
  if (fused) u = x;
  const float* nw = fused ? norm_w : nullptr;
  MoeScratch sc = layout(m, T, scratch);
  if (!m.moe) {
    if (!has(m.sh_gate_up) || m.Is <= 0) fail_internal("moe: a dense MLP needs its gate/up/down weights");
    dense_mlp(m, u, T, x, sc, main_stream, nw, eps);
    return;
  }
  const int H = m.H;
  // shared expert: on the side stream when given, overlapping the routed experts
  const bool has_shared = !m.shared_in_stack && has(m.sh_gate_up) && m.Is > 0;
  if (!has_shared) side = nullptr;
  cudaStream_t s = main_stream;
  if (side) {
    LILY_CU(cudaEventRecord(fork, main_stream));
    LILY_CU(cudaStreamWaitEvent(side, fork, 0));
    s = side;
  }
  if (has_shared) {
    swiglu_gate_up(m, u, T, sc, s, nw, eps, nullptr, moe_gemv_rows());
    linear(m.sh_down, H, m.Is, sc.sh_h, m.Is, T, sc.ysh, H, false, s);
    if (has(m.sh_gate) && !m.gate_in_router) linear(m.sh_gate, 1, H, u, H, T, sc.sg, 1, false, s, nw, eps);
  }
  if (side) LILY_CU(cudaEventRecord(join, side));
  s = main_stream;
  // router rows [0, E) (+ the shared-expert gate as row E when gate_in_router)
  const int ldl = m.gate_in_router ? m.E + 1 : m.E;
  if (m.E > 32 * kTopkMaxPerLane || m.slots_per_token() > 32)
    fail_internal("moe: at most 512 experts and 32 slots per token (top-k + shared) on CUDA");
  TopkArgs ta;
  ta.E = m.E; ta.k = m.k; ta.norm_topk = m.norm_topk; ta.shared = m.shared_in_stack; ta.shared_gated = m.gate_in_router;
  ta.idx = sc.idx; ta.w = sc.w;
  if (!(T <= kTopkFoldRows && m.topk_counter && gemv_topk(m.router, ldl, H, u, T, sc.logits, nw, eps, ta, m.topk_counter, s))) {
    if (gemm_prec_for(m.router) != GemmPrec::kSplit) linear(m.router, ldl, H, u, H, T, sc.logits, ldl, false, s, nw, eps);
    else linear_split(m.router, ldl, H, u, H, T, sc.logits, ldl, s, nw, eps);  // fp32-class logits for the top-k
    launch_pdl(topk_kernel, dim3(T), dim3(32), 0, s, sc.logits, int64_t(ldl), ta);
    LILY_CU_LAUNCH();
  }
  const int kk = m.slots_per_token();
  const int n = T * kk;
  const int32_t* pos = nullptr;
  // grouped: slots sorted per expert into tiles of kRowsTile rows for the multi-row products (EXL3: the
  // prompt path's 64-row tiles, whose GEMM also decodes each expert once per tile)
  const bool grouped = !fused && rows_moe_on(T, m.gate_up.exl3);
  const bool rows = grouped && rows_covers(m.gate_up, H) && rows_covers(m.down, m.I);
  if (T <= moe_gemv_rows() && !grouped) {
    const bool ring_gu = gemv_ring(m.gate_up, sc.idx, 0, H, u, H, kk, n, sc.h, m.I, false, m.I, s, nw, eps);
    if (!ring_gu) gemv_slots(m.gate_up, sc.idx, 0, H, u, H, kk, n, sc.h, m.I, false, m.I, s, nw, eps);
    // no side-stream shared expert: the down products of a token's slots and their weighted sum into its
    // residual row are one product over the slots' concatenated rows (all tokens in one launch)
    if (!has_shared &&
        gemv_ring_concat(m.down, sc.idx, H, m.I, sc.h, m.I, sc.w, n, T, x, H, true, s, ring_gu && ring_early_ids()))
      return;
    // EXL3, no side-stream shared expert: the down GEMV adds the weighted slots into the residual itself
    if (!has_shared && exl3_gemv_combine(m.down, sc.idx, H, m.I, sc.h, m.I, sc.w, kk, T, x, H, s)) return;
    gemv_slots(m.down, sc.idx, H, m.I, sc.h, m.I, 1, n, sc.yb, H, false, 0, s);
  } else {
    const int En = m.E + (m.shared_in_stack ? 1 : 0);  // experts in the stacks
    if (En > 1024) fail_internal("moe: at most 1024 experts in the stacks on CUDA");
    // both expert products on the wgmma kernel: tiles of its unit's 128 rows
    const bool wg = !rows && wgmma_covers(m.gate_up, H, u, H) && wgmma_covers(m.down, m.I, sc.h, m.I);
    const int tr = rows ? kRowsTile : wg ? kGemmUnitRows : kGemmBM;
    route_kernel<<<1, 1024, sizeof(int) * 3 * En, s>>>(sc.idx, n, En, kk, tr, sc.counts, sc.slot_pos, sc.sorted_tok,
                                                       sc.tiles, sc.n_tiles);
    LILY_CU_LAUNCH();
    const int mt = max_tiles_for(m, T, tr);
    if (rows) {
      if (!rows_product(m.gate_up, 2 * m.I, H, u, H, sc.sorted_tok, sc.h, m.I, false, m.I, sc.tiles, sc.n_tiles, mt, n,
                        s, nullptr, 1e-6f, T) ||
          !rows_product(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, 0, sc.tiles, sc.n_tiles, mt, n, s))
        fail_internal("moe: the multi-row expert product declined an input it covers");
    } else if (wg) {
      if (!gemm_wgmma(m.gate_up, 2 * m.I, H, u, H, sc.sorted_tok, sc.gu, 2 * m.I, false, sc.tiles, sc.n_tiles, mt, n,
                      gemm_prec_for(m.gate_up), s))
        fail_internal("moe: the wgmma kernel declined the gate|up product it covers");
      swiglu_kernel<<<cdiv(int64_t(n) * m.I, 256), 256, 0, s>>>(sc.gu, m.I, n, sc.h);
      LILY_CU_LAUNCH();
      if (!gemm_wgmma(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, sc.tiles, sc.n_tiles, mt, n,
                      gemm_prec_for(m.down), s))
        fail_internal("moe: the wgmma kernel declined the down product it covers");
    } else {
      gemm_tiles(m.gate_up, 2 * m.I, H, u, H, sc.sorted_tok, sc.gu, 2 * m.I, false, sc.tiles, sc.n_tiles, mt, n, s, T);
      swiglu_kernel<<<cdiv(int64_t(n) * m.I, 256), 256, 0, s>>>(sc.gu, m.I, n, sc.h);
      LILY_CU_LAUNCH();
      gemm_tiles(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, sc.tiles, sc.n_tiles, mt, n, s);
    }
    pos = sc.slot_pos;
  }
  const float* sg = !(has_shared && has(m.sh_gate)) ? nullptr : m.gate_in_router ? sc.logits + m.E : sc.sg;
  if (side) LILY_CU(cudaStreamWaitEvent(s, join, 0));
  launch_pdl(combine_kernel, dim3(cdiv(H, 128), T), dim3(128), 0, s, x, H, kk, sc.w, pos, sc.yb,
             has_shared ? sc.ysh : nullptr, sg, m.gate_in_router ? ldl : 1);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
