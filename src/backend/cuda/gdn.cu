// Gated DeltaNet core (model doc §3.4 steps 2-7, §4): causal depthwise conv + SiLU with a carried conv
// state, L2 norms, gates, the delta rule with an fp32 state [Hv, dv, dk], and the gated RMSNorm.
// Decode and short steps (sm_90): one fused kernel, a cluster of CTAs per key head, each warp keeping
// a few state rows in registers across the step's tokens; other devices and shapes: conv, then one
// warp per (value head, dv row), then the gated norm, as separate kernels. Prompts: the chunked rule
// (C = 64, §4.1), one block per (value head, 32-column slice of dv) carrying its state slice in shared
// memory from chunk to chunk.
#include <atomic>
#include <cmath>
#include <type_traits>

#include "backend/cuda/gdn.h"
#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kChunk = 64;
constexpr int kSlice = 32;
constexpr int kChunkMaxDk = 128;  // shared memory of the chunk kernel grows with dk
constexpr int kFusedMaxT = 16;    // steps up to this many rows may take the fused step kernel

struct GdnScratch {
  float *conv_out, *qn, *kn, *g, *beta;
  size_t bytes;
};

GdnScratch layout(const GdnDev& d, int T, void* base) {
  GdnScratch s{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* r = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return r; };
  s.conv_out = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * d.C()));
  s.qn = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * d.Hk * d.dk));
  s.kn = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * d.Hk * d.dk));
  s.g = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * d.Hv));
  s.beta = reinterpret_cast<float*>(take(sizeof(float) * size_t(T) * d.Hv));
  s.bytes = off;
  return s;
}

// y[t, c] = silu(sum_j w[c, j] · s[t - K + 1 + j, c]); s[<0] from the conv state. 32 rows per thread.
// K is a template parameter so that the sliding window stays in registers.
template <int K>
__global__ void conv_kernel(const float* __restrict__ proj, int64_t ldp, int T, int C, const float* __restrict__ w,
                            float* __restrict__ state, float* __restrict__ y, bool write_state) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int t0 = blockIdx.y * 32, t1 = min(T, t0 + 32);
  float win[K];  // inputs t-K+1 .. t
  float wc[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wc[j] = w[int64_t(c) * K + j];
  auto in = [&](int t) { return t >= 0 ? proj[int64_t(t) * ldp + c] : state[int64_t(K - 1 + t) * C + c]; };
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = in(t0 - K + 1 + j);
#pragma unroll 4
  for (int t = t0; t < t1; ++t) {
    win[K - 1] = in(t);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += wc[j] * win[j];
    y[int64_t(t) * C + c] = silu(acc);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
  }
  if (write_state) {  // one row-chunk only (T <= 32): this thread read every input of channel c already
#pragma unroll
    for (int j = 0; j < K - 1; ++j) state[int64_t(j) * C + c] = win[j];
  }
}

// conv state <- the last K-1 inputs (state rows followed by this step's rows).
__global__ void conv_state_kernel(const float* __restrict__ proj, int64_t ldp, int T, int C, int K, float* __restrict__ state) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float nw[8];
  for (int r = 0; r < K - 1; ++r) {
    const int t = T - (K - 1) + r;  // step row index of the value that lands in state row r
    nw[r] = t >= 0 ? proj[int64_t(t) * ldp + c] : state[int64_t(K - 1 + t) * C + c];
  }
  for (int r = 0; r < K - 1; ++r) state[int64_t(r) * C + c] = nw[r];
}

// One warp per (value head j, dv row d); lanes hold S[j, d, lane + 32 i].
template <int DKL>
__global__ void __launch_bounds__(128) recurrent_kernel(const float* __restrict__ xc, const float* __restrict__ proj, int64_t ldp,
    int T, int Hk, int Hv, int dv, const float* __restrict__ dt_bias, const float* __restrict__ A_neg,
    float* __restrict__ S, float* __restrict__ o) {
  constexpr int dk = 32 * DKL;
  const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int j = gw / dv, d = gw % dv;
  if (j >= Hv) return;
  const int hk = j / (Hv / Hk);
  const int C = 2 * Hk * dk + Hv * dv;
  float* Srow = S + (int64_t(j) * dv + d) * dk;
  float s[DKL];
#pragma unroll
  for (int i = 0; i < DKL; ++i) s[i] = Srow[lane + 32 * i];
  const float qscale = rsqrtf(float(dk));
  const float An = A_neg[j], dtb = dt_bias[j];
  for (int t = 0; t < T; ++t) {
    const float* xr = xc + int64_t(t) * C;
    float q[DKL], k[DKL], qq = 0.f, kk = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      q[i] = xr[hk * dk + lane + 32 * i];
      k[i] = xr[Hk * dk + hk * dk + lane + 32 * i];
      qq += q[i] * q[i];
      kk += k[i] * k[i];
    }
    const float v = xr[2 * Hk * dk + j * dv + d];
    const float* pr = proj + int64_t(t) * ldp + C + Hv * dv;
    const float beta = sigmoid(pr[j]);
    const float decay = expf(An * softplus(pr[Hv + j] + dtb));
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    const float qn = rsqrtf(qq + 1e-6f) * qscale, kn = rsqrtf(kk + 1e-6f);
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      k[i] *= kn;
      s[i] *= decay;
      m += s[i] * k[i];
    }
    m = warp_sum(m);
    const float delta = beta * (v - m);
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      s[i] += k[i] * delta;
      out += s[i] * q[i] * qn;
    }
    out = warp_sum(out);
    if (lane == 0) o[int64_t(t) * Hv * dv + int64_t(j) * dv + d] = out;
  }
#pragma unroll
  for (int i = 0; i < DKL; ++i) Srow[lane + 32 * i] = s[i];
}

// Decode and short steps, fused: conv + SiLU, L2 norms, gates, the recurrent delta rule and the gated
// RMSNorm in one kernel (sm_90: thread block clusters and distributed shared memory).
//
// Grid: one cluster of CS = G·NS CTAs per key head hk (cluster id hk). CTA rank r serves value head
// j = hk·G + r / NS and its R = dv / NS state rows [R·(r mod NS), +R). 256 threads = 8 warps; warp w
// owns the RW = R / 8 consecutive rows from row0 = R·(r mod NS) + RW·w. The warp's lanes form RWP
// (RW rounded up to a power of two) groups of LPR = 32 / RWP lanes; group g holds row row0 + g (idle
// when g >= RW), each lane CPL = dk / LPR of its columns in registers for the whole call: lane li of
// a group holds columns VW·(li + LPR·u) + e (u < CPL / VW, e < VW: VW-wide vector accesses).
// A key head's state spread over up to 8 CTAs (SMs) streams in and out in parallel.
//
// Only the state recurrence is sequential over the step's tokens, so the kernel runs in phases:
//  1. every token's inputs of the CTA's channels (q, k channels of hk, v channels of its rows) staged
//     in xs[t] with all loads in flight together, then replaced by the conv outputs, each thread
//     sliding a window of its channels' last kStepMaxK inputs in registers (win[q] = the input 3 - q
//     steps before the current token's, taps aligned to the newest input); gates, z; then each
//     token's q and k scales (one warp per vector).
//  2. per token: the rows' delta rule (dot products reduce over LPR lanes, a warp's rows side by
//     side), outputs into os[t], and each warp's Σo² over its rows pushed with st.async into
//     recv[t][8·(r mod NS) + w] of every CTA of its value head, completing that CTA's mbarrier.
//  3. state and conv state written back, one wait on the mbarrier (all tokens' partials), then the
//     gated RMSNorm and the outputs: one exchange per call, no cluster barrier per token.
// Conv state: the CTA of rank 0 writes the q/k channels of hk, each CTA its own v channels. Every CTA
// reads the old conv state before its arrival at the cluster barrier (end of phase 1), which rank 0
// passes (start of phase 2) before writing that state in phase 3. The same barrier orders the mbarrier
// initialisations before any peer's push; a CTA exits only after every push into it has landed.
constexpr int kStepThreads = 256;
constexpr int kStepWarps = kStepThreads / 32;
constexpr int kStepMaxRWP = 8;   // rows per warp (power of two)
constexpr int kStepMaxCPL = 32;  // state columns per lane (registers: state, q and k, CPL each)
constexpr int kStepMaxK = 4;     // conv taps held per channel
constexpr int kStepMinRows = 16; // smallest row slice per CTA (below, the redundant q/k conv dominates)
constexpr int kStepMaxCluster = 8;  // portable cluster size

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_id_x() {
  unsigned r;
  asm("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
// All threads of the cluster, warp-uniform call sites (.aligned). Arrive releases this thread's prior
// memory operations; wait acquires those of every thread that arrived.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The shared::cluster address of this CTA's shared address `a` in the CTA of cluster rank `rank`.
__device__ __forceinline__ uint32_t peer_addr(uint32_t a, unsigned rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialisations visible to the cluster (peers' complete_tx).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival plus `bytes` expected transaction bytes for the barrier's current phase.
__device__ __forceinline__ void mbar_expect(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Spins until the phase of parity `parity` completes. The data arrives in this CTA's own shared memory
// with the transaction bytes (as with bulk copies), so a CTA-scope acquire suffices; a cluster-scope
// one would also invalidate L1.
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// 4 bytes into a peer's shared memory, completing 4 transaction bytes on the peer's mbarrier.
__device__ __forceinline__ void st_async_f32(uint32_t remote, float v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
               ::"r"(remote), "r"(__float_as_uint(v)), "r"(remote_bar) : "memory");
}
#endif

// Sum over aligned groups of W lanes (every lane of a group gets it).
template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// a·b over N elements with four partial sums (shorter dependency chain).
template <int N>
__device__ __forceinline__ float dot4(const float* a, const float* b) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i & 3] = fmaf(a[i], b[i], acc[i & 3]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}
// VW consecutive floats (shared or global memory, aligned to 4·VW bytes).
template <int VW>
__device__ __forceinline__ void ld_vec(const float* p, float* d) {
  if constexpr (VW == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
  } else if constexpr (VW == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    d[0] = v.x; d[1] = v.y;
  } else {
    d[0] = p[0];
  }
}
template <int VW>
__device__ __forceinline__ void st_vec(float* p, const float* d) {
  if constexpr (VW == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(d[0], d[1], d[2], d[3]);
  } else if constexpr (VW == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(d[0], d[1]);
  } else {
    p[0] = d[0];
  }
}

// Launched with cluster dims (G·ns, 1, 1) and grid Hk·G·ns; host guarantees 1 <= T <= kFusedMaxT,
// dv % ns == 0, R = dv / ns with R % 8 == 0 and RWP / 2 < R / 8 <= RWP, DKL·RWP <= kStepMaxCPL,
// G·ns <= kStepMaxCluster, 1 <= K <= kStepMaxK and S 16-byte aligned (vector state loads and stores,
// each group's row segment contiguous per VW columns). Up to dk = 128 and 16 state columns per lane, at
// most 128 registers a thread: two CTAs fit on an SM, so a cluster of 8 finds room in a GPC also beside
// the kernels that programmatic dependent launch overlaps.
// b|a folded into the step (one token): rows j and Hv + j of the bf16 W [2·Hv, H] (row stride ld) times
// RMSNorm(x)·norm_w; w == null: proj holds b|a. H % 8 == 0 and H <= 8·kStepThreads·kBaMaxU.
constexpr int kBaMaxU = 2;
struct BaFold {
  const uint16_t* w = nullptr;
  int64_t ld = 0;
  int H = 0;
  const float* x = nullptr;  // row 0 of the call (a group's row: x + first·ldx)
  int64_t ldx = 0;
  const float* norm_w = nullptr;
  float eps = 0.f;
};

template <int DKL, int RWP>
__global__ void __launch_bounds__(kStepThreads, DKL <= 4 && DKL * RWP <= 16 ? 2 : 1)
    gdn_step_kernel(const float* __restrict__ proj_in, int64_t ldp, int T_in, int Hk, int Hv, int dv, int K, int ns,
                    const float* __restrict__ convw, float* __restrict__ conv_in, const float* __restrict__ dt_bias,
                    const float* __restrict__ A_neg, const float* __restrict__ normw, float eps, float* __restrict__ S_in,
                    float* __restrict__ out_in, const BaFold ba, const StepSeqs seqs, const int32_t* __restrict__ list) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int dk = 32 * DKL, LPR = 32 / RWP, CPL = dk / LPR, VW = CPL < 4 ? CPL : 4, NV = CPL / VW;
  constexpr int kRows = kStepWarps * RWP;  // rows of a CTA, at most
  constexpr int kCh = 2 * dk + kRows;      // channels of a CTA, at most
  constexpr int kSlots = (kCh + kStepThreads - 1) / kStepThreads;  // channels per thread
  constexpr int kTM = kFusedMaxT;
  __shared__ __align__(16) float xs[kTM][kCh];   // per token: conv outputs q, k of hk, v of rows [R·sl, +R)
  __shared__ __align__(16) float gs[kTM][4];     // per token: q scale, k scale, beta, decay
  __shared__ float zs[kTM][kRows];               // per token: z of the CTA's rows
  __shared__ float os[kTM][kRows];               // per token: delta-rule outputs of the CTA's rows
  __shared__ float recv[kTM][kStepMaxCluster * kStepWarps];  // per token: Σo² of the value head's warps
  __shared__ __align__(8) uint64_t bar;                      // recv complete (one phase)
  allow_dependent_launch();
  const int G = Hv / Hk, R = dv / ns, RW = R / kStepWarps;
  const int hk = int(cluster_id_x()), rank = int(cluster_rank());
  const int C = 2 * Hk * dk + Hv * dv;
  const int64_t conv_n = int64_t(K - 1) * C, S_n = int64_t(Hv) * dv * dk;  // floats per state version
  // This CTA's sequence: the call's (list == null: conv_in and S_in read and written in place) or group
  // list[blockIdx.y] of a step (read from its slot's current version; written back there, or with a
  // tentative group into version cur + 1 + t after each row t, the current version untouched).
  int T = T_in, tent = 0, cur = 0, ring = 1;
  const float* proj = proj_in;
  float* out = out_in;
  float* conv_state = conv_in;
  float* S = S_in;
  float* conv_ring = conv_in;
  float* S_ring = S_in;
  const float* bax = ba.x;
  if (list) {
    const DevGroup& gr = seqs.groups[list[blockIdx.y]];
    const DevSlotLayer& e = seqs.slots[gr.slot];
    T = gr.rows;
    proj = proj_in + int64_t(gr.first) * ldp;
    out = out_in + int64_t(gr.first) * Hv * dv;
    cur = gr.cur;
    ring = gr.ring;
    tent = gr.tentative;
    conv_ring = e.conv;
    S_ring = e.S;
    conv_state = e.conv + int64_t(cur) * conv_n;
    S = e.S + int64_t(cur) * S_n;
    if (bax) bax += int64_t(gr.first) * ba.ldx;
  }
  const int jj = rank / ns, sl = rank % ns, j = hk * G + jj;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane / LPR, li = lane % LPR;
  const bool live = g < RW;              // this lane's group has a row
  const bool writer = live && li == 0;   // stores the row's delta-rule output
  const int nch = 2 * dk + R;
  const int lrow = warp * RW + (live ? g : 0);  // this lane's row within the CTA's slice
  if (tid == 0) {
    mbar_init(smem_addr(&bar), 1);
    mbar_init_fence();
  }
  __syncwarp();  // (one thread; the race checker attributes the initialisation to another lane)
  if (tid == 0) mbar_expect(smem_addr(&bar), unsigned(sizeof(float) * T * ns * kStepWarps));
  // Inputs not written by the previous kernel load before grid_dependency_wait (programmatic dependent
  // launch: they overlap its tail): state rows, conv taps, gate parameters, norm weight.
  float* Srow = S + (int64_t(j) * dv + sl * R + lrow) * dk;
  float s[CPL];
#pragma unroll
  for (int i = 0; i < CPL; ++i) s[i] = 0.f;
  if (live) {
#pragma unroll
    for (int u = 0; u < NV; ++u) ld_vec<VW>(Srow + VW * (li + LPR * u), s + u * VW);
  }
  int ch[kSlots];                  // global channel of slot m (CTA channel tid + 256 m), -1 if none
  float wa[kSlots][kStepMaxK];     // taps aligned to the newest input: wa[q] multiplies win[q]
#pragma unroll
  for (int m = 0; m < kSlots; ++m) {
    const int i = tid + kStepThreads * m;
    ch[m] = i >= nch ? -1 : i < dk ? hk * dk + i : i < 2 * dk ? Hk * dk + hk * dk + (i - dk)
                                                  : 2 * Hk * dk + j * dv + sl * R + (i - 2 * dk);
#pragma unroll
    for (int q = 0; q < kStepMaxK; ++q) {
      const int tap = K - kStepMaxK + q;  // convw[c, tap] multiplies the input K-1-tap steps back
      wa[m][q] = ch[m] >= 0 && tap >= 0 ? convw[int64_t(ch[m]) * K + tap] : 0.f;
    }
  }
  const float An = A_neg[j], dtb = dt_bias[j];
  const float nw0 = lane < R ? normw[sl * R + lane] : 0.f, nw1 = lane + 32 < R ? normw[sl * R + lane + 32] : 0.f;
  uint4 wb[kBaMaxU], wa2[kBaMaxU];  // this thread's 8-element pieces of the b and a rows (weights: before the wait)
#pragma unroll
  for (int u = 0; u < kBaMaxU; ++u) {
    const int e = 8 * (tid + kStepThreads * u);
    const bool ok = ba.w && e < ba.H;
    wb[u] = ok ? __ldg(reinterpret_cast<const uint4*>(ba.w + int64_t(j) * ba.ld + e)) : make_uint4(0, 0, 0, 0);
    wa2[u] = ok ? __ldg(reinterpret_cast<const uint4*>(ba.w + int64_t(Hv + j) * ba.ld + e)) : make_uint4(0, 0, 0, 0);
  }
  grid_dependency_wait();
  __shared__ float bared[kStepWarps][3];
  if (ba.w) {  // Σx², Σ(x·n)·w_b, Σ(x·n)·w_a over the row, one block reduction for the three
    float ss = 0.f, db = 0.f, da = 0.f;
#pragma unroll
    for (int u = 0; u < kBaMaxU; ++u) {
      const int e = 8 * (tid + kStepThreads * u);
      if (e < ba.H) {
        float xv[8], nv[8], fb[8], fa[8];
        ld_vec<4>(bax + e, xv);
        ld_vec<4>(bax + e + 4, xv + 4);
        ld_vec<4>(ba.norm_w + e, nv);
        ld_vec<4>(ba.norm_w + e + 4, nv + 4);
        bf8(wb[u], fb);
        bf8(wa2[u], fa);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ss = fmaf(xv[i], xv[i], ss);
          const float xn = xv[i] * nv[i];
          db = fmaf(xn, fb[i], db);
          da = fmaf(xn, fa[i], da);
        }
      }
    }
    ss = group_sum<32>(ss);
    db = group_sum<32>(db);
    da = group_sum<32>(da);
    if (lane == 0) { bared[warp][0] = ss; bared[warp][1] = db; bared[warp][2] = da; }
    __syncthreads();
  }

  // ---- phase 1: conv outputs, gates, z for every token
  // win[q] = the input 4 - q steps before token 0: conv state row K - 5 + q where that is >= 0
  float win[kSlots][kStepMaxK];
#pragma unroll
  for (int m = 0; m < kSlots; ++m)
#pragma unroll
    for (int q = 0; q < kStepMaxK; ++q) {
      const int row = K - 1 - kStepMaxK + q;
      win[m][q] = ch[m] >= 0 && row >= 0 ? conv_state[int64_t(row) * C + ch[m]] : 0.f;
    }
  // raw inputs into xs (each thread its own channels), z and gate inputs: all loads in flight together
#pragma unroll 4
  for (int t = 0; t < T; ++t) {
    const float* pt = proj + int64_t(t) * ldp;
#pragma unroll
    for (int m = 0; m < kSlots; ++m)
      if (ch[m] >= 0) xs[t][tid + kStepThreads * m] = pt[ch[m]];
  }
  const float* pz = proj + C + int64_t(j) * dv + sl * R;  // z of the CTA's rows, token 0
#pragma unroll 4
  for (int idx = tid; idx < T * R; idx += kStepThreads) zs[idx / R][idx % R] = pz[int64_t(idx / R) * ldp + idx % R];
  float bt = 0.f, at = 0.f;
  if (ba.w) {
    if (tid == 0) {
      float ss = 0.f, db = 0.f, da = 0.f;
#pragma unroll
      for (int w = 0; w < kStepWarps; ++w) { ss += bared[w][0]; db += bared[w][1]; da += bared[w][2]; }
      const float inv = rsqrtf(ss / float(ba.H) + ba.eps);
      bt = db * inv;
      at = da * inv;
    }
  } else if (tid < T) {
    const float* pr = proj + int64_t(tid) * ldp + C + Hv * dv;
    bt = pr[j];
    at = pr[Hv + j];
  }
  // conv outputs in place of the raw inputs
#pragma unroll 4
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int m = 0; m < kSlots; ++m) {
      if (ch[m] >= 0) {
        float* xi = &xs[t][tid + kStepThreads * m];
#pragma unroll
        for (int q = 0; q + 1 < kStepMaxK; ++q) win[m][q] = win[m][q + 1];
        win[m][kStepMaxK - 1] = *xi;
        float acc = 0.f;
#pragma unroll
        for (int q = 0; q < kStepMaxK; ++q) acc = fmaf(wa[m][q], win[m][q], acc);
        *xi = silu(acc);
        if (tent && (rank == 0 || tid + kStepThreads * m >= 2 * dk)) {  // the conv state after row t
          float* cv = conv_ring + int64_t((cur + 1 + t) % ring) * conv_n;
#pragma unroll
          for (int q = 0; q < kStepMaxK; ++q) {
            const int row = q + K - 1 - kStepMaxK;
            if (row >= 0) cv[int64_t(row) * C + ch[m]] = win[m][q];
          }
        }
      }
    }
  }
  if (tid < T) {
    gs[tid][2] = sigmoid(bt);
    gs[tid][3] = expf(An * softplus(at + dtb));
  }
  // The mbarrier is initialised and this CTA's reads of the old conv state are done (consumed above).
  cluster_arrive();
  __syncthreads();
  // q and k scales: one warp per (token, q or k) vector
  for (int v = warp; v < 2 * T; v += kStepWarps) {
    const int t = v >> 1, isk = v & 1;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      const float x = xs[t][isk * dk + lane + 32 * i];
      ss = fmaf(x, x, ss);
    }
    ss = group_sum<32>(ss);
    if (lane == 0) gs[t][isk] = isk ? rsqrtf(ss + 1e-6f) : rsqrtf(ss + 1e-6f) * rsqrtf(float(dk));
  }
  __syncthreads();

  // ---- phase 2: the recurrence, token by token
  cluster_wait();  // every peer's mbarrier is initialised; rank 0 may write the q/k conv state later
  const unsigned peer = unsigned(jj * ns + (lane < ns ? lane : 0));  // lane l < ns pushes to rank jj·ns + l
  const uint32_t peer_recv = peer_addr(smem_addr(&recv[0][sl * kStepWarps + warp]), peer);
  const uint32_t peer_bar = peer_addr(smem_addr(&bar), peer);
  constexpr uint32_t kRecvStride = sizeof(float) * kStepMaxCluster * kStepWarps;
#pragma unroll 1
  for (int t = 0; t < T; ++t) {
    const float4 gt = *reinterpret_cast<const float4*>(gs[t]);  // q scale, k scale, beta, decay
    const float* x = xs[t];
    float q[CPL], k[CPL];
#pragma unroll
    for (int u = 0; u < NV; ++u) ld_vec<VW>(x + dk + VW * (li + LPR * u), k + u * VW);
    const float v = x[2 * dk + lrow];
    // s <- decay·s + k̂·delta, k̂ = ks·k, delta = beta·(v - decay·(s·k̂))
    const float sk = group_sum<LPR>(dot4<CPL>(s, k));
    const float cdelta = gt.y * gt.z * (v - gt.w * gt.y * sk);
#pragma unroll
    for (int i = 0; i < CPL; ++i) s[i] = fmaf(k[i], cdelta, s[i] * gt.w);
    if (tent && live) {  // the state after row t
      float* sv = S_ring + int64_t((cur + 1 + t) % ring) * S_n + (int64_t(j) * dv + sl * R + lrow) * dk;
#pragma unroll
      for (int u = 0; u < NV; ++u) st_vec<VW>(sv + VW * (li + LPR * u), s + u * VW);
    }
#pragma unroll
    for (int u = 0; u < NV; ++u) ld_vec<VW>(x + VW * (li + LPR * u), q + u * VW);
    const float o = gt.x * group_sum<LPR>(dot4<CPL>(s, q));
    if (writer) os[t][lrow] = o;
    float ss = live ? o * o : 0.f;  // Σo² over the warp's rows: one value per group
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane < ns) st_async_f32(peer_recv + t * kRecvStride, ss, peer_bar);
  }

  // ---- phase 3: write-backs, then the gated RMSNorm once every partial has landed
  if (live && !tent) {
#pragma unroll
    for (int u = 0; u < NV; ++u) st_vec<VW>(Srow + VW * (li + LPR * u), s + u * VW);
  }
  // conv state row r <- input T - K + 1 + r, held in win[5 - K + r] after the last token
#pragma unroll
  for (int m = 0; m < kSlots; ++m) {
    const int i = tid + kStepThreads * m;
    if (!tent && ch[m] >= 0 && (rank == 0 || i >= 2 * dk)) {
#pragma unroll
      for (int q = 0; q < kStepMaxK; ++q) {
        const int row = q + K - 1 - kStepMaxK;
        if (row >= 0) conv_state[int64_t(row) * C + ch[m]] = win[m][q];
      }
    }
  }
  __syncthreads();  // os of every warp
  mbar_wait(smem_addr(&bar), 0);
  const float inv_dv = 1.f / float(dv);
  for (int t = warp; t < T; t += kStepWarps) {  // warp per token
    float tot = 0.f;
    for (int e = lane; e < ns * kStepWarps; e += 32) tot += recv[t][e];
    tot = group_sum<32>(tot);
    const float inv = rsqrtf(tot * inv_dv + eps);
    float* orow = out + int64_t(t) * Hv * dv + int64_t(j) * dv + sl * R;
    if (lane < R) orow[lane] = os[t][lane] * inv * nw0 * silu(zs[t][lane]);
    if (lane + 32 < R) orow[lane + 32] = os[t][lane + 32] * inv * nw1 * silu(zs[t][lane + 32]);
  }
#endif
}

// Step kernel split of a key head (NS slices per value head, RWP rows per warp rounded up to a power
// of two); ns = 0: the shape cannot take the step kernel. NS is the largest power of two <= 8 / G whose
// row slice R = dv / NS splits evenly over the 8 warps, with R >= kStepMinRows (unless NS = 1) and
// the state columns per lane within kStepMaxCPL.
struct StepSplit {
  int ns = 0, rwp = 0;
};
StepSplit step_split(int G, int dk, int dv) {
  StepSplit sp;
  if (G < 1 || G > kStepMaxCluster || kStepMaxCluster % G != 0) return sp;
  for (int ns = kStepMaxCluster / G; ns >= 1; ns /= 2) {
    if (dv % ns != 0) continue;
    const int R = dv / ns;
    if (R % kStepWarps != 0 || R / kStepWarps > kStepMaxRWP) continue;
    if (ns > 1 && R < kStepMinRows) continue;
    int rwp = 1;
    while (rwp < R / kStepWarps) rwp *= 2;
    if ((dk / 32) * rwp > kStepMaxCPL) continue;
    sp.ns = ns;
    sp.rwp = rwp;
    return sp;
  }
  return sp;
}

// Thread block clusters need compute capability 9.0; cached per device.
bool device_has_clusters() {
  static std::atomic<int> cache[64];  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) {
    int major = 0;
    LILY_CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    LILY_CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    v = major >= 9 ? 2 : 1;
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// Normalised q (scaled by 1/sqrt(dk)) and k per (token, key head); g and beta per (token, value head).
__global__ void prep_kernel(const float* __restrict__ xc, const float* __restrict__ proj, int64_t ldp, int T, int Hk,
                            int Hv, int dk, int dv, const float* __restrict__ dt_bias, const float* __restrict__ A_neg,
                            float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ g, float* __restrict__ beta) {
  const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int C = 2 * Hk * dk + Hv * dv;
  const float* xr = xc + int64_t(t) * C;
  for (int h = w; h < 2 * Hk; h += blockDim.x >> 5) {
    const float* src = xr + h * dk;  // q heads then k heads
    float ss = 0.f;
    for (int i = lane; i < dk; i += 32) ss += src[i] * src[i];
    ss = warp_sum(ss);
    const bool isq = h < Hk;
    const float sc = rsqrtf(ss + 1e-6f) * (isq ? rsqrtf(float(dk)) : 1.f);
    float* dst = (isq ? qn + (int64_t(t) * Hk + h) * dk : kn + (int64_t(t) * Hk + h - Hk) * dk);
    for (int i = lane; i < dk; i += 32) dst[i] = src[i] * sc;
  }
  const float* pr = proj + int64_t(t) * ldp + C + Hv * dv;
  for (int j = threadIdx.x; j < Hv; j += blockDim.x) {
    beta[int64_t(t) * Hv + j] = sigmoid(pr[j]);
    g[int64_t(t) * Hv + j] = A_neg[j] * softplus(pr[Hv + j] + dt_bias[j]);
  }
}

// Chunked gated delta rule for value head j = blockIdx.x, dv columns [32·blockIdx.y, +32).
__global__ void __launch_bounds__(256) chunk_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
    const float* __restrict__ xc, const float* __restrict__ g, const float* __restrict__ beta, int T, int Hk, int Hv,
    int dk, int dv, float* __restrict__ S, float* __restrict__ o) {
  extern __shared__ float sm[];
  const int P = dk + 1, PV = kSlice + 1, PA = kChunk + 1;
  float* Qs = sm;                         // [64][P]
  float* Ks = Qs + kChunk * P;            // [64][P]
  float* Ws = Ks + kChunk * P;            // [64][P]
  float* Us = Ws + kChunk * P;            // [64][PV]  V, then U, then V'
  float* As = Us + kChunk * PV;           // [64][PA]  strict lower beta·KKᵀ·Γ
  float* Bs = As + kChunk * PA;           // [64][PA]  QKᵀ·Γ, diagonal included
  float* Ss = Bs + kChunk * PA;           // [dk][PV]  state slice S[i][c]
  float* gam = Ss + dk * PV;              // [64]
  float* bs = gam + kChunk;               // [64]
  const int j = blockIdx.x, c0 = blockIdx.y * kSlice, tid = threadIdx.x;
  const int hk = j / (Hv / Hk);
  const int C = 2 * Hk * dk + Hv * dv;
  const int ncols = min(kSlice, dv - c0);
  float* Sg = S + int64_t(j) * dv * dk;
  for (int e = tid; e < dk * kSlice; e += 256) {
    const int i = e % dk, c = e / dk;
    Ss[i * PV + c] = c < ncols ? Sg[int64_t(c0 + c) * dk + i] : 0.f;
  }
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    const int L = min(kChunk, T - t0);
    for (int e = tid; e < kChunk * dk; e += 256) {
      const int r = e / dk, i = e % dk;
      const bool live = r < L;
      Qs[r * P + i] = live ? qn[(int64_t(t0 + r) * Hk + hk) * dk + i] : 0.f;
      Ks[r * P + i] = live ? kn[(int64_t(t0 + r) * Hk + hk) * dk + i] : 0.f;
    }
    for (int e = tid; e < kChunk * kSlice; e += 256) {
      const int r = e / kSlice, c = e % kSlice;
      Us[r * PV + c] = (r < L && c < ncols) ? xc[int64_t(t0 + r) * C + 2 * Hk * dk + j * dv + c0 + c] : 0.f;
    }
    if (tid < kChunk) {
      gam[tid] = tid < L ? g[int64_t(t0 + tid) * Hv + j] : 0.f;
      bs[tid] = tid < L ? beta[int64_t(t0 + tid) * Hv + j] : 0.f;
    }
    __syncthreads();
    if (tid < 32) {  // inclusive prefix sum of g over the chunk (two values per lane)
      float a = gam[2 * tid], b = a + gam[2 * tid + 1];
      float run = b;
      for (int o2 = 1; o2 < 32; o2 <<= 1) {
        const float n = __shfl_up_sync(0xffffffffu, run, o2);
        if (tid >= o2) run += n;
      }
      const float excl = run - b;
      gam[2 * tid] = excl + a;
      gam[2 * tid + 1] = run;
    }
    __syncthreads();
    for (int e = tid; e < kChunk * kChunk; e += 256) {
      const int r = e / kChunk, s2 = e % kChunk;
      float a = 0.f, b = 0.f;
      if (s2 <= r) {
        float kk = 0.f, qk = 0.f;
        for (int i = 0; i < dk; ++i) {
          const float ks = Ks[s2 * P + i];
          kk += Ks[r * P + i] * ks;
          qk += Qs[r * P + i] * ks;
        }
        const float gm = expf(gam[r] - gam[s2]);
        b = qk * gm;
        if (s2 < r) a = bs[r] * kk * gm;
      }
      As[r * PA + s2] = a;
      Bs[r * PA + s2] = b;
    }
    for (int e = tid; e < kChunk * kSlice; e += 256) {
      const int r = e / kSlice, c = e % kSlice;
      Us[r * PV + c] *= bs[r];
    }
    for (int e = tid; e < kChunk * dk; e += 256) {
      const int r = e / dk, i = e % dk;
      Ws[r * P + i] = bs[r] * expf(gam[r]) * Ks[r * P + i];
    }
    __syncthreads();
    // (I + A) [U | W] = [βV | β e^γ K]: forward substitution, row by row.
    for (int r = 1; r < kChunk; ++r) {
      for (int col = tid; col < kSlice + dk; col += 256) {
        float acc = 0.f;
        if (col < kSlice) {
          for (int s2 = 0; s2 < r; ++s2) acc += As[r * PA + s2] * Us[s2 * PV + col];
          Us[r * PV + col] -= acc;
        } else {
          const int i = col - kSlice;
          for (int s2 = 0; s2 < r; ++s2) acc += As[r * PA + s2] * Ws[s2 * P + i];
          Ws[r * P + i] -= acc;
        }
      }
      __syncthreads();
    }
    // V' = U - W S
    for (int e = tid; e < kChunk * kSlice; e += 256) {
      const int r = e / kSlice, c = e % kSlice;
      float acc = 0.f;
      for (int i = 0; i < dk; ++i) acc += Ws[r * P + i] * Ss[i * PV + c];
      Us[r * PV + c] -= acc;
    }
    __syncthreads();
    // O = (Q ⊙ e^γ) S + Aqk V'
    for (int e = tid; e < kChunk * kSlice; e += 256) {
      const int r = e / kSlice, c = e % kSlice;
      if (r >= L || c >= ncols) continue;
      float a = 0.f, b = 0.f;
      for (int i = 0; i < dk; ++i) a += Qs[r * P + i] * Ss[i * PV + c];
      for (int s2 = 0; s2 <= r; ++s2) b += Bs[r * PA + s2] * Us[s2 * PV + c];
      o[int64_t(t0 + r) * Hv * dv + int64_t(j) * dv + c0 + c] = expf(gam[r]) * a + b;
    }
    __syncthreads();
    // S <- e^{γ_last} S + (K ⊙ e^{γ_last - γ})ᵀ V'
    const float gl = gam[kChunk - 1];
    for (int e = tid; e < dk * kSlice; e += 256) {
      const int i = e / kSlice, c = e % kSlice;
      float acc = 0.f;
      for (int r = 0; r < kChunk; ++r) acc += Ks[r * P + i] * expf(gl - gam[r]) * Us[r * PV + c];
      Ss[i * PV + c] = expf(gl) * Ss[i * PV + c] + acc;
    }
    __syncthreads();
  }
  for (int e = tid; e < dk * kSlice; e += 256) {
    const int i = e % dk, c = e / dk;
    if (c < ncols) Sg[int64_t(c0 + c) * dk + i] = Ss[i * PV + c];
  }
}

// out[t, j·dv + d] = RMSNorm(o[t, j, :])[d] · w[d] · silu(z[t, j·dv + d]); one warp per (t, j), in place.
__global__ void gated_norm_kernel(float* __restrict__ o, const float* __restrict__ proj, int64_t ldp, int T, int Hv,
                                  int dv, int zoff, const float* __restrict__ w, float eps) {
  const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (gw >= T * Hv) return;
  const int t = gw / Hv, j = gw % Hv;
  float* orow = o + int64_t(t) * Hv * dv + int64_t(j) * dv;
  const float* z = proj + int64_t(t) * ldp + zoff + int64_t(j) * dv;
  float ss = 0.f;
  for (int d = lane; d < dv; d += 32) ss += orow[d] * orow[d];
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(dv) + eps);
  for (int d = lane; d < dv; d += 32) orow[d] = orow[d] * inv * w[d] * silu(z[d]);
}

// ---- short groups of a step without the fused kernel (devices without clusters, shapes it does not take):
// the same three stages as the fallback of gdn_core, each group reading its slot's state (step form of
// step_desc.h; y-block g serves group list[g]). Tentative groups keep the states after every row.

// Conv + SiLU of one channel over one group's rows (sequential: the window slides in registers).
template <int K>
__global__ void conv_groups_kernel(const float* __restrict__ proj, int64_t ldp, int C, const float* __restrict__ w,
                                   const StepSeqs seqs, const int32_t* __restrict__ list, float* __restrict__ y) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const DevGroup& gr = seqs.groups[list[blockIdx.y]];
  float* ring = seqs.slots[gr.slot].conv;
  const int64_t conv_n = int64_t(K - 1) * C;
  float* st = ring + int64_t(gr.cur) * conv_n;
  float win[K], wc[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wc[j] = w[int64_t(c) * K + j];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = st[int64_t(j) * C + c];
  for (int t = 0; t < gr.rows; ++t) {
    const int64_t row = gr.first + t;
    win[K - 1] = proj[row * ldp + c];
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += wc[j] * win[j];
    y[row * C + c] = silu(acc);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
    if (gr.tentative) {
      float* cv = ring + int64_t((gr.cur + 1 + t) % gr.ring) * conv_n;
#pragma unroll
      for (int j = 0; j < K - 1; ++j) cv[int64_t(j) * C + c] = win[j];
    }
  }
  if (!gr.tentative) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) st[int64_t(j) * C + c] = win[j];
  }
}

// The delta rule of recurrent_kernel per (group, value head j, dv row d), one warp each.
template <int DKL>
__global__ void __launch_bounds__(128) recurrent_groups_kernel(const float* __restrict__ xc, const float* __restrict__ proj,
    int64_t ldp, int Hk, int Hv, int dv, const float* __restrict__ dt_bias, const float* __restrict__ A_neg,
    const StepSeqs seqs, const int32_t* __restrict__ list, float* __restrict__ o) {
  constexpr int dk = 32 * DKL;
  const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  const int j = gw / dv, d = gw % dv;
  if (j >= Hv) return;
  const DevGroup& gr = seqs.groups[list[blockIdx.y]];
  float* ring = seqs.slots[gr.slot].S;
  const int64_t S_n = int64_t(Hv) * dv * dk, off = (int64_t(j) * dv + d) * dk;
  const int hk = j / (Hv / Hk);
  const int C = 2 * Hk * dk + Hv * dv;
  const float* Srow = ring + int64_t(gr.cur) * S_n + off;
  float s[DKL];
#pragma unroll
  for (int i = 0; i < DKL; ++i) s[i] = Srow[lane + 32 * i];
  const float qscale = rsqrtf(float(dk));
  const float An = A_neg[j], dtb = dt_bias[j];
  for (int t = 0; t < gr.rows; ++t) {
    const int64_t row = gr.first + t;
    const float* xr = xc + row * C;
    float q[DKL], k[DKL], qq = 0.f, kk = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      q[i] = xr[hk * dk + lane + 32 * i];
      k[i] = xr[Hk * dk + hk * dk + lane + 32 * i];
      qq += q[i] * q[i];
      kk += k[i] * k[i];
    }
    const float v = xr[2 * Hk * dk + j * dv + d];
    const float* pr = proj + row * ldp + C + Hv * dv;
    const float beta = sigmoid(pr[j]);
    const float decay = expf(An * softplus(pr[Hv + j] + dtb));
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    const float qn = rsqrtf(qq + 1e-6f) * qscale, kn = rsqrtf(kk + 1e-6f);
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      k[i] *= kn;
      s[i] *= decay;
      m += s[i] * k[i];
    }
    m = warp_sum(m);
    const float delta = beta * (v - m);
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      s[i] += k[i] * delta;
      out += s[i] * q[i] * qn;
    }
    out = warp_sum(out);
    if (lane == 0) o[row * Hv * dv + int64_t(j) * dv + d] = out;
    if (gr.tentative) {
      float* sv = ring + int64_t((gr.cur + 1 + t) % gr.ring) * S_n + off;
#pragma unroll
      for (int i = 0; i < DKL; ++i) sv[lane + 32 * i] = s[i];
    }
  }
  if (!gr.tentative) {
    float* sw = ring + int64_t(gr.cur) * S_n + off;
#pragma unroll
    for (int i = 0; i < DKL; ++i) sw[lane + 32 * i] = s[i];
  }
}

// gated_norm_kernel over the step rows rows[0 .. n) only.
__global__ void gated_norm_rows_kernel(float* __restrict__ o, const float* __restrict__ proj, int64_t ldp,
                                       const int32_t* __restrict__ rows, int n, int Hv, int dv, int zoff,
                                       const float* __restrict__ w, float eps) {
  const int gw = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (gw >= n * Hv) return;
  const int64_t t = rows[gw / Hv];
  const int j = gw % Hv;
  float* orow = o + t * Hv * dv + int64_t(j) * dv;
  const float* z = proj + t * ldp + zoff + int64_t(j) * dv;
  float ss = 0.f;
  for (int d = lane; d < dv; d += 32) ss += orow[d] * orow[d];
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(dv) + eps);
  for (int d = lane; d < dv; d += 32) orow[d] = orow[d] * inv * w[d] * silu(z[d]);
}

size_t chunk_smem(int dk) {
  return sizeof(float) * (size_t(3) * kChunk * (dk + 1) + size_t(kChunk) * (kSlice + 1) + size_t(2) * kChunk * (kChunk + 1) +
                          size_t(dk) * (kSlice + 1) + 2 * kChunk);
}

}  // namespace

namespace {
// The fused step kernel over `groups` CTA grids of one cluster per key head (list == null: one sequence
// at conv_state / S; else the step's groups list[0 .. groups)).
void launch_step(const GdnDev& g, const StepSplit& sp, float* proj, int T, float* conv_state, float* S, float* out,
                 const BaFold& fold, const StepSeqs& seqs, const int32_t* list, int groups, cudaStream_t s) {
  const int G = g.Hv / g.Hk;
  const int64_t ldp = g.proj_width();
  PdlLaunch L(dim3(unsigned(g.Hk * G * sp.ns), unsigned(groups)), dim3(kStepThreads), 0, s, unsigned(G * sp.ns));
  auto launch = [&](auto dkl, auto rwp) {
    constexpr int D = decltype(dkl)::value, W = decltype(rwp)::value;
    if constexpr (D * W <= kStepMaxCPL) {
      LILY_CU(cudaLaunchKernelEx(&L.cfg, gdn_step_kernel<D, W>, proj, ldp, T, g.Hk, g.Hv, g.dv, g.K, sp.ns, g.conv,
                                 conv_state, g.dt_bias, g.A_neg, g.norm, g.eps, S, out, fold, seqs, list));
    } else {
      fail_internal("gdn: step kernel split out of range");
    }
  };
  auto by_rwp = [&](auto dkl) {
    switch (sp.rwp) {
      case 1: launch(dkl, std::integral_constant<int, 1>{}); break;
      case 2: launch(dkl, std::integral_constant<int, 2>{}); break;
      case 4: launch(dkl, std::integral_constant<int, 4>{}); break;
      default: launch(dkl, std::integral_constant<int, 8>{}); break;
    }
  };
  switch (g.dk) {
    case 32: by_rwp(std::integral_constant<int, 1>{}); break;
    case 64: by_rwp(std::integral_constant<int, 2>{}); break;
    case 128: by_rwp(std::integral_constant<int, 4>{}); break;
    default: by_rwp(std::integral_constant<int, 8>{}); break;
  }
  LILY_CU_LAUNCH();
}

// The fused kernel's split for this shape on this device (ns == 0: not taken).
StepSplit fused_split(const GdnDev& g) {
  if (g.K > kStepMaxK || !(g.dk == 32 || g.dk == 64 || g.dk == 128 || g.dk == 256) || !device_has_clusters()) return {};
  return step_split(g.Hv / g.Hk, g.dk, g.dv);
}

// The b|a fold of the step kernel for one-row sequences, when W is bf16 and the shapes fit.
bool fold_fits(const GdnBa& ba) {
  const Mat& W = *ba.W;
  return !W.affine && !W.exl3 && ba.norm_w && ba.in % 8 == 0 && ba.in <= 8 * kStepThreads * kBaMaxU && W.ld % 8 == 0 &&
         ba.ldx % 4 == 0 && aligned16(W.w) && aligned16(ba.x) && aligned16(ba.norm_w);
}
}  // namespace

void init_gdn_kernels() {
  LILY_CU(cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(chunk_smem(kChunkMaxDk))));
  init_gdn_chunk_kernels();
}

size_t gdn_scratch_bytes(const GdnDev& g, int T) {
  return layout(g, T, nullptr).bytes + gdn_chunk_scratch_bytes(T, g.Hv, g.dk, g.dv);  // the chunk pass's part last
}

void gdn_core(const GdnDev& g, float* proj, int T, float* conv_state, float* S, float* out, void* scratch,
              cudaStream_t s, int chunk_min, const GdnBa* ba) {
  if (T <= 0) return;
  if (!(g.K >= 1 && g.K <= 8 && g.Hv % g.Hk == 0)) fail_internal("gdn_core: bad dimensions");
  GdnScratch sc = layout(g, T, scratch);
  const int C = g.C();
  const int64_t ldp = g.proj_width();
  const StepSplit sp = T < chunk_min && T <= kFusedMaxT ? fused_split(g) : StepSplit{};
  const bool step = sp.ns > 0 && (reinterpret_cast<uintptr_t>(S) & 15) == 0;
  BaFold fold;
  if (ba) {
    const Mat& W = *ba->W;
    if (step && T == 1 && fold_fits(*ba)) {
      fold.w = W.w; fold.ld = W.ld; fold.H = ba->in; fold.x = ba->x; fold.ldx = ba->ldx; fold.norm_w = ba->norm_w;
      fold.eps = ba->eps;
    } else {
      linear(W, 2 * g.Hv, ba->in, ba->x, ba->ldx, T, proj + C + int64_t(g.Hv) * g.dv, ldp, false, s, ba->norm_w, ba->eps);
    }
  }
  if (step) {
    launch_step(g, sp, proj, T, conv_state, S, out, fold, StepSeqs{}, nullptr, 1, s);
    return;
  }
  const bool one_chunk = T <= 32;  // then the conv kernel also writes the new conv state
  {
    const dim3 grid(cdiv(C, 128), cdiv(T, 32));
#define LILY_CONV(N) conv_kernel<N><<<grid, 128, 0, s>>>(proj, ldp, T, C, g.conv, conv_state, sc.conv_out, one_chunk)
    switch (g.K) {
      case 1: LILY_CONV(1); break;
      case 2: LILY_CONV(2); break;
      case 3: LILY_CONV(3); break;
      case 4: LILY_CONV(4); break;
      case 5: LILY_CONV(5); break;
      case 6: LILY_CONV(6); break;
      case 7: LILY_CONV(7); break;
      default: LILY_CONV(8); break;
    }
#undef LILY_CONV
    LILY_CU_LAUNCH();
  }
  if (!one_chunk) {
    conv_state_kernel<<<cdiv(C, 128), 128, 0, s>>>(proj, ldp, T, C, g.K, conv_state);
    LILY_CU_LAUNCH();
  }
  if (T >= chunk_min && g.dk <= kChunkMaxDk) {
    prep_kernel<<<T, 256, 0, s>>>(sc.conv_out, proj, ldp, T, g.Hk, g.Hv, g.dk, g.dv, g.dt_bias, g.A_neg, sc.qn, sc.kn, sc.g, sc.beta);
    LILY_CU_LAUNCH();
    if (gdn_chunk_fast_covers(g.dk, g.dv)) {
      gdn_chunk_fast(sc.qn, sc.kn, sc.conv_out, sc.g, sc.beta, T, g.Hk, g.Hv, g.dk, g.dv, S, out,
                     static_cast<char*>(scratch) + sc.bytes, s);
    } else {
      const size_t smem = chunk_smem(g.dk);
      chunk_kernel<<<dim3(g.Hv, cdiv(g.dv, kSlice)), 256, smem, s>>>(sc.qn, sc.kn, sc.conv_out, sc.g, sc.beta, T, g.Hk,
                                                                    g.Hv, g.dk, g.dv, S, out);
      LILY_CU_LAUNCH();
    }
  } else {
    const unsigned blocks = cdiv(int64_t(g.Hv) * g.dv, 4);
#define LILY_REC(N) recurrent_kernel<N><<<blocks, 128, 0, s>>>(sc.conv_out, proj, ldp, T, g.Hk, g.Hv, g.dv, g.dt_bias, g.A_neg, S, out)
    switch (g.dk) {
      case 32: LILY_REC(1); break;
      case 64: LILY_REC(2); break;
      case 128: LILY_REC(4); break;
      case 256: LILY_REC(8); break;
      default: fail_internal("gdn_core: linear_key_head_dim must be 32, 64, 128 or 256 on CUDA");
    }
#undef LILY_REC
    LILY_CU_LAUNCH();
  }
  gated_norm_kernel<<<cdiv(int64_t(T) * g.Hv, 4), 128, 0, s>>>(out, proj, ldp, T, g.Hv, g.dv, C, g.norm, g.eps);
  LILY_CU_LAUNCH();
}

bool gdn_groups_fused(const GdnDev& g) { return fused_split(g).ns > 0; }

void gdn_groups(const GdnDev& g, float* proj, int T, const StepSeqs& seqs, const int32_t* list, int groups,
                const int32_t* rows, int n_rows, float* out, void* scratch, cudaStream_t s, const GdnBa* ba) {
  if (groups <= 0) return;
  if (!seqs.row_group || !list || !rows) fail_internal("gdn_groups: needs the step form and the group and row lists");
  if (!(g.K >= 1 && g.K <= 8 && g.Hv % g.Hk == 0)) fail_internal("gdn_groups: bad dimensions");
  const int C = g.C();
  const int64_t ldp = g.proj_width();
  const StepSplit sp = fused_split(g);
  BaFold fold;
  if (ba) {  // every group is one row: T == groups
    const Mat& W = *ba->W;
    if (sp.ns > 0 && T == groups && fold_fits(*ba)) {
      fold.w = W.w; fold.ld = W.ld; fold.H = ba->in; fold.x = ba->x; fold.ldx = ba->ldx; fold.norm_w = ba->norm_w;
      fold.eps = ba->eps;
    } else {
      linear(W, 2 * g.Hv, ba->in, ba->x, ba->ldx, T, proj + C + int64_t(g.Hv) * g.dv, ldp, false, s, ba->norm_w, ba->eps);
    }
  }
  if (sp.ns > 0) {
    launch_step(g, sp, proj, T, nullptr, nullptr, out, fold, seqs, list, groups, s);
    return;
  }
  GdnScratch sc = layout(g, T, scratch);
  {
    const dim3 grid(cdiv(C, 128), unsigned(groups));
#define LILY_CONV(N) conv_groups_kernel<N><<<grid, 128, 0, s>>>(proj, ldp, C, g.conv, seqs, list, sc.conv_out)
    switch (g.K) {
      case 1: LILY_CONV(1); break;
      case 2: LILY_CONV(2); break;
      case 3: LILY_CONV(3); break;
      case 4: LILY_CONV(4); break;
      case 5: LILY_CONV(5); break;
      case 6: LILY_CONV(6); break;
      case 7: LILY_CONV(7); break;
      default: LILY_CONV(8); break;
    }
#undef LILY_CONV
    LILY_CU_LAUNCH();
  }
  {
    const dim3 grid(cdiv(int64_t(g.Hv) * g.dv, 4), unsigned(groups));
#define LILY_REC(N) recurrent_groups_kernel<N><<<grid, 128, 0, s>>>(sc.conv_out, proj, ldp, g.Hk, g.Hv, g.dv, g.dt_bias, \
                                                                  g.A_neg, seqs, list, out)
    switch (g.dk) {
      case 32: LILY_REC(1); break;
      case 64: LILY_REC(2); break;
      case 128: LILY_REC(4); break;
      case 256: LILY_REC(8); break;
      default: fail_internal("gdn_groups: linear_key_head_dim must be 32, 64, 128 or 256 on CUDA");
    }
#undef LILY_REC
    LILY_CU_LAUNCH();
  }
  gated_norm_rows_kernel<<<cdiv(int64_t(n_rows) * g.Hv, 4), 128, 0, s>>>(out, proj, ldp, rows, n_rows, g.Hv, g.dv, C, g.norm,
                                                                       g.eps);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
