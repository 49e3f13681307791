// The fused Gated DeltaNet step kernel (sm_90 thread block clusters) for decode and short steps: one
// sequence (gdn_core) or a grid of a step's short groups (gdn_groups), tentative groups keeping their
// state after every row.
#include <atomic>
#include <type_traits>

#include "backend/cuda/gdn_internal.cuh"

namespace lily::cuda {
namespace {

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
  __shared__ float bared[kStepWarps][kBaFoldRows][3];
  if (ba.w) {  // per token: Σx², Σ(x·n)·w_b, Σ(x·n)·w_a over the row, one block reduction for the three
    for (int t = 0; t < T; ++t) {
      float ss = 0.f, db = 0.f, da = 0.f;
#pragma unroll
      for (int u = 0; u < kBaMaxU; ++u) {
        const int e = 8 * (tid + kStepThreads * u);
        if (e < ba.H) {
          float xv[8], nv[8], fb[8], fa[8];
          ld_vec<4>(bax + t * ba.ldx + e, xv);
          ld_vec<4>(bax + t * ba.ldx + e + 4, xv + 4);
          if (ba.norm_w) {
            ld_vec<4>(ba.norm_w + e, nv);
            ld_vec<4>(ba.norm_w + e + 4, nv + 4);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) nv[i] = 1.f;
          }
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
      if (lane == 0) { bared[warp][t][0] = ss; bared[warp][t][1] = db; bared[warp][t][2] = da; }
    }
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
    if (tid < T) {  // thread t: token t's gates
      float ss = 0.f, db = 0.f, da = 0.f;
#pragma unroll
      for (int w = 0; w < kStepWarps; ++w) { ss += bared[w][tid][0]; db += bared[w][tid][1]; da += bared[w][tid][2]; }
      const float inv = ba.norm_w ? rsqrtf(ss / float(ba.H) + ba.eps) : 1.f;
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

}  // namespace

// The fused step kernel over `groups` CTA grids of one cluster per key head (list == null: one sequence
// at conv_state / S; else the step's groups list[0 .. groups)).
void gdn_launch_step(const GdnDev& g, const StepSplit& sp, float* proj, int T, float* conv_state, float* S, float* out,
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
StepSplit gdn_fused_split(const GdnDev& g) {
  if (g.K > kStepMaxK || !(g.dk == 32 || g.dk == 64 || g.dk == 128 || g.dk == 256) || !device_has_clusters()) return {};
  return step_split(g.Hv / g.Hk, g.dk, g.dv);
}

// The b|a fold of the step kernel (sequences of at most kBaFoldRows rows), when W is bf16 and the shapes fit.
bool gdn_fold_fits(const GdnBa& ba) {
  const Mat& W = *ba.W;
  return !W.affine && !W.exl3 && ba.in % 8 == 0 && ba.in <= 8 * kStepThreads * kBaMaxU && W.ld % 8 == 0 &&
         ba.ldx % 4 == 0 && aligned16(W.w) && aligned16(ba.x) && (!ba.norm_w || aligned16(ba.norm_w));
}

}  // namespace lily::cuda
