// MoE block on the device: router, top-k with softmax over the selected experts, expert SwiGLU MLPs,
// shared expert with its sigmoid gate, weighted combine into the residual. No host synchronisation:
// decode (T <= kMoeGemvRows) runs one GEMV slot per (token, choice); prompts sort the (token, choice)
// slots by expert on the device (histogram, prefix scan, scatter, tile map) and run the tiled GEMM over
// a tile list whose live length is read on the device.
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kMoeGemvRows = 4;

struct MoeScratch {
  float *logits, *w, *gu, *h, *yb, *sh_gu, *sh_h, *ysh, *sg;
  int32_t *idx, *slot_pos, *sorted_tok, *tiles, *n_tiles, *counts;
  size_t bytes;
};

int max_tiles_for(const MoeDev& m, int T) { return int(cdiv(int64_t(T) * m.k, kGemmBM)) + m.E; }

MoeScratch layout(const MoeDev& m, int T, void* base) {
  MoeScratch s{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* r = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return r; };
  const size_t n = size_t(T) * size_t(m.k);
  s.logits = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * m.E));
  s.w = reinterpret_cast<float*>(take(sizeof(float) * n));
  s.idx = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.slot_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.sorted_tok = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * n));
  s.tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * 3 * size_t(max_tiles_for(m, T))));
  s.n_tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  s.counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(m.E + 1)));
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

// One block per token: top-k of the router logits (ties: lowest index) and their routing weights.
__global__ void topk_kernel(const float* __restrict__ logits, int E, int k, bool norm_topk, int32_t* __restrict__ idx,
                            float* __restrict__ wout) {
  extern __shared__ float sl[];
  __shared__ float red[32];
  __shared__ int redi[32];
  __shared__ float selv[64];
  const float* l = logits + int64_t(blockIdx.x) * E;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) { sl[e] = l[e]; mx = fmaxf(mx, l[e]); }
  // max over the block
  mx = warp_max(mx);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) red[wid] = mx;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = lane < nw ? red[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  const float gmax = red[0];
  float se = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) se += expf(sl[e] - gmax);
  __syncthreads();
  const float total = block_sum(se, red);
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (sl[e] > best) { best = sl[e]; bi = e; }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    __syncthreads();
    if (lane == 0) { red[wid] = best; redi[wid] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      float b = red[0];
      int i = redi[0];
      for (int q = 1; q < nw; ++q)
        if (red[q] > b || (red[q] == b && redi[q] < i)) { b = red[q]; i = redi[q]; }
      idx[int64_t(blockIdx.x) * k + j] = i;
      selv[j] = b;
      sl[i] = -INFINITY;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float denom = 0.f;
    if (norm_topk) {
      for (int j = 0; j < k; ++j) denom += expf(selv[j] - selv[0]);
      for (int j = 0; j < k; ++j) wout[int64_t(blockIdx.x) * k + j] = expf(selv[j] - selv[0]) / denom;
    } else {
      for (int j = 0; j < k; ++j) wout[int64_t(blockIdx.x) * k + j] = expf(selv[j] - gmax) / total;
    }
  }
}

// One block: expert histogram, prefix scan, tile map, scatter of slots into expert order.
__global__ void route_kernel(const int32_t* __restrict__ idx, int n, int E, int k, int32_t* __restrict__ counts,
                             int32_t* __restrict__ slot_pos, int32_t* __restrict__ sorted_tok,
                             int32_t* __restrict__ tiles, int32_t* __restrict__ n_tiles) {
  extern __shared__ int sh[];  // cnt[E], off[E], fill[E]
  int* cnt = sh;
  int* off = sh + E;
  int* fill = sh + 2 * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) atomicAdd(&cnt[idx[s]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int o = 0, t = 0;
    for (int e = 0; e < E; ++e) {
      off[e] = o;
      counts[e] = cnt[e];
      for (int r = 0; r < cnt[e]; r += kGemmBM) {
        tiles[3 * t] = e; tiles[3 * t + 1] = o + r; tiles[3 * t + 2] = min(kGemmBM, cnt[e] - r);
        ++t;
      }
      o += cnt[e];
    }
    counts[E] = o;
    *n_tiles = t;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
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

// x[t] += sum_j w[t,j] · yb[slot_pos(t,j)] + gate(t) · ysh[t]
__global__ void combine_kernel(float* __restrict__ x, int H, int k, const float* __restrict__ w,
                               const int32_t* __restrict__ slot_pos, const float* __restrict__ yb,
                               const float* __restrict__ ysh, const float* __restrict__ sg) {
  const int t = blockIdx.x;
  const float g = sg ? sigmoid(sg[t]) : 1.f;
  float* xr = x + int64_t(t) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    float acc = xr[i];
    for (int j = 0; j < k; ++j) {
      const int s = t * k + j;
      const int p = slot_pos ? slot_pos[s] : s;
      acc += w[s] * yb[int64_t(p) * H + i];
    }
    if (ysh) acc += g * ysh[int64_t(t) * H + i];
    xr[i] = acc;
  }
}

}  // namespace

size_t moe_scratch_bytes(const MoeDev& m, int T) { return layout(m, T, nullptr).bytes; }

void moe(const MoeDev& m, const float* u, int T, float* x, void* scratch, cudaStream_t s) {
  if (T <= 0) return;
  MoeScratch sc = layout(m, T, scratch);
  const int H = m.H;
  // shared expert (or dense MLP)
  const bool has_shared = has(m.sh_gate_up) && m.Is > 0;
  if (has_shared) {
    if (T <= kMoeGemvRows) {
      gemv_slots(m.sh_gate_up, nullptr, 0, H, u, H, 1, T, sc.sh_h, m.Is, false, m.Is, s);
    } else {
      linear(m.sh_gate_up, 2 * m.Is, H, u, H, T, sc.sh_gu, 2 * m.Is, false, s);
      swiglu_kernel<<<cdiv(int64_t(T) * m.Is, 256), 256, 0, s>>>(sc.sh_gu, m.Is, T, sc.sh_h);
      LILY_CU_LAUNCH();
    }
    linear(m.sh_down, H, m.Is, sc.sh_h, m.Is, T, sc.ysh, H, false, s);
    if (has(m.sh_gate)) linear(m.sh_gate, 1, H, u, H, T, sc.sg, 1, false, s);
  }
  if (!m.moe) {
    combine_kernel<<<T, 256, 0, s>>>(x, H, 0, sc.w, nullptr, sc.yb, has_shared ? sc.ysh : nullptr, nullptr);
    LILY_CU_LAUNCH();
    return;
  }
  linear(m.router, m.E, H, u, H, T, sc.logits, m.E, false, s);
  topk_kernel<<<T, 256, sizeof(float) * m.E, s>>>(sc.logits, m.E, m.k, m.norm_topk, sc.idx, sc.w);
  LILY_CU_LAUNCH();
  const int n = T * m.k;
  const int32_t* pos = nullptr;
  if (T <= kMoeGemvRows) {
    gemv_slots(m.gate_up, sc.idx, 0, H, u, H, m.k, n, sc.h, m.I, false, m.I, s);
    gemv_slots(m.down, sc.idx, H, m.I, sc.h, m.I, 1, n, sc.yb, H, false, 0, s);
  } else {
    route_kernel<<<1, 1024, sizeof(int) * 3 * m.E, s>>>(sc.idx, n, m.E, m.k, sc.counts, sc.slot_pos, sc.sorted_tok,
                                                        sc.tiles, sc.n_tiles);
    LILY_CU_LAUNCH();
    const int mt = max_tiles_for(m, T);
    gemm_tiles(m.gate_up, 2 * m.I, H, u, H, sc.sorted_tok, sc.gu, 2 * m.I, false, sc.tiles, sc.n_tiles, mt, n, s);
    swiglu_kernel<<<cdiv(int64_t(n) * m.I, 256), 256, 0, s>>>(sc.gu, m.I, n, sc.h);
    LILY_CU_LAUNCH();
    gemm_tiles(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, sc.tiles, sc.n_tiles, mt, n, s);
    pos = sc.slot_pos;
  }
  combine_kernel<<<T, 256, 0, s>>>(x, H, m.k, sc.w, pos, sc.yb, has_shared ? sc.ysh : nullptr,
                                   has_shared && has(m.sh_gate) ? sc.sg : nullptr);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
