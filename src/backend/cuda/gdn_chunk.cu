// Chunked gated delta rule (model doc §4, chunks of 64 rows) in two passes:
//   wy pass, one block per (chunk, value head), all chunks at once: cumulative log-decay γ, the strict
//     lower A = β_r (k_r·k_s) e^{γr-γs} and the causal B = (q_r·k_s) e^{γr-γs}; forward substitution
//     (I + A)[W | U] = [β e^γ K | β V]; W, U, B, γ go to scratch.
//   state pass, one block per (value head, 32 columns of dv), serial over chunks with the state slice
//     H [dk, 32] in shared memory: V' = U - W H, o = e^γ (Q H) + B V',
//     H <- e^{γlast} H + (K e^{γlast-γ})ᵀ V'.
// Arithmetic is fp32 throughout (SIMT FMA, register tiles from shared memory). Per layer the work is
// ~10 GFLOP at 2048 rows, so FMA throughput is not the limit; what the single-pass kernel lacked was
// parallelism outside the state recurrence. fp32 also keeps the forward substitution (which amplifies
// operand rounding by up to ‖(I + A)⁻¹‖) and the state carried over every chunk of the prompt at the
// accuracy of the reference kernel.
#include <algorithm>

#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kC = 64;       // rows per chunk
constexpr int kNC = 32;      // dv columns per state-pass block
constexpr int kThreads = 256;
constexpr int kSmemWanted = 200 * 1024;  // opt-in dynamic shared memory asked for (Hopper allows 227 KiB)
int g_smem_limit = kSmemWanted;         // lowered to the device's opt-in maximum by init_gdn_chunk_kernels
bool g_enabled = true;

struct ChunkScratch {
  float *W, *U, *B, *G;
  size_t bytes;
};

ChunkScratch chunk_layout(int T, int Hv, int dk, int dv, void* base) {
  ChunkScratch s{};
  const size_t nch = cdiv(T, kC), Tp = nch * kC;
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) { char* r = p ? p + off : nullptr; off += (n * sizeof(float) + 255) & ~size_t(255); return reinterpret_cast<float*>(r); };
  s.W = take(size_t(Hv) * Tp * dk);       // [Hv][Tp][dk]
  s.U = take(size_t(Hv) * Tp * dv);       // [Hv][Tp][dv]
  s.B = take(size_t(Hv) * nch * kC * kC); // [Hv][nch][64][64], zero above the diagonal
  s.G = take(size_t(Hv) * Tp);            // [Hv][Tp] γ, cumulative within each chunk
  s.bytes = off;
  return s;
}

size_t wy_smem(int dk, int dv) {
  const size_t r0 = std::max(size_t(2) * kC * (dk + 1), size_t(kC) * (dk + dv));
  return sizeof(float) * (r0 + size_t(kC) * (kC + 1) + 2 * kC);
}
size_t state_smem(int dk) {
  return sizeof(float) * (size_t(3) * kC * (dk + 4) + size_t(kC) * (kC + 4) + size_t(2) * kC * (kNC + 1) +
                          size_t(dk) * (kNC + 1) + kC);
}

// 16-byte global -> shared copy, asynchronous on sm_80+; live == false writes zeros (src is not read).
__device__ __forceinline__ void cp16(float* dst, const float* src, bool live) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(live ? 16 : 0) : "memory");
#else
  *reinterpret_cast<float4*>(dst) = live ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}
__device__ __forceinline__ void cp_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Block (chunk c = blockIdx.x, value head j = blockIdx.y). Thread (ty, tx) = (tid / 16, tid % 16) owns
// the 4×4 entries (ty + 16a, tx + 16b) of the 64×64 products.
template <int DK>
__global__ void __launch_bounds__(kThreads) wy_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
    const float* __restrict__ xc, const float* __restrict__ g, const float* __restrict__ beta, int T, int Hk, int Hv,
    int dv, float* __restrict__ Wg, float* __restrict__ Ug, float* __restrict__ Bg, float* __restrict__ Gg) {
  constexpr int P = DK + 1;  // odd pitch: the 16 rows s = tx + 16b of one load sit in distinct banks
  extern __shared__ float sm[];
  const int XP = DK + dv;
  float* Qs = sm;            // [64][P]   phase 1
  float* Ks = Qs + kC * P;   // [64][P]   phase 1
  float* Xs = sm;            // [64][XP]  phase 2, over Qs/Ks: [W | U] columns
  float* As = sm + max(2 * kC * P, kC * XP);  // [64][65]
  float* gam = As + kC * (kC + 1);            // [64]
  float* bet = gam + kC;                      // [64]
  const int c = blockIdx.x, j = blockIdx.y, tid = threadIdx.x;
  const int t0 = c * kC, L = min(kC, T - t0);
  const int hk = j / (Hv / Hk);
  const int Cw = 2 * Hk * DK + Hv * dv;
  const int64_t Tp = int64_t(gridDim.x) * kC;
  for (int e = tid; e < kC * DK / 4; e += kThreads) {
    const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
    float4 q = make_float4(0.f, 0.f, 0.f, 0.f), k = q;
    if (r < L) {
      const int64_t src = (int64_t(t0 + r) * Hk + hk) * DK + i;
      q = *reinterpret_cast<const float4*>(qn + src);
      k = *reinterpret_cast<const float4*>(kn + src);
    }
    float* qd = Qs + r * P + i;
    float* kd = Ks + r * P + i;
    qd[0] = q.x; qd[1] = q.y; qd[2] = q.z; qd[3] = q.w;
    kd[0] = k.x; kd[1] = k.y; kd[2] = k.z; kd[3] = k.w;
  }
  if (tid < kC) {
    gam[tid] = tid < L ? g[int64_t(t0 + tid) * Hv + j] : 0.f;
    bet[tid] = tid < L ? beta[int64_t(t0 + tid) * Hv + j] : 0.f;
  }
  __syncthreads();
  if (tid < 32) {  // inclusive prefix sum of g over the chunk, two rows per lane
    const float a = gam[2 * tid], b = a + gam[2 * tid + 1];
    float run = b;
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, run, o2);
      if (tid >= o2) run += n;
    }
    gam[2 * tid] = run - b + a;
    gam[2 * tid + 1] = run;
  }
  __syncthreads();
  if (tid < kC) Gg[int64_t(j) * Tp + t0 + tid] = gam[tid];
  const int tx = tid & 15, ty = tid >> 4;
  float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 4
  for (int i = 0; i < DK; ++i) {
    float ka[4], qa[4], kb[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      ka[a] = Ks[(ty + 16 * a) * P + i];
      qa[a] = Qs[(ty + 16 * a) * P + i];
      kb[a] = Ks[(tx + 16 * a) * P + i];
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        kk[a][b] += ka[a] * kb[b];
        qk[a][b] += qa[a] * kb[b];
      }
  }
  float* Bc = Bg + (int64_t(j) * gridDim.x + c) * kC * kC;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int r = ty + 16 * a, s2 = tx + 16 * b;
      float av = 0.f, bv = 0.f;
      if (s2 <= r) {  // γr - γs <= 0 here: the decays never overflow
        const float gm = expf(gam[r] - gam[s2]);
        bv = qk[a][b] * gm;
        if (s2 < r) av = bet[r] * kk[a][b] * gm;
      }
      As[r * (kC + 1) + s2] = av;
      Bc[r * kC + s2] = bv;
    }
  __syncthreads();  // Qs/Ks are dead: build the right-hand sides over them
  if (tid < kC) gam[tid] = bet[tid] * expf(gam[tid]);  // β e^γ (γ itself is already stored)
  __syncthreads();
  for (int e = tid; e < kC * XP; e += kThreads) {
    const int r = e / XP, col = e % XP;
    float x = 0.f;
    if (r < L) {
      const int64_t t = t0 + r;
      x = col < DK ? gam[r] * kn[(t * Hk + hk) * DK + col] : bet[r] * xc[t * Cw + 2 * Hk * DK + int64_t(j) * dv + (col - DK)];
    }
    Xs[r * XP + col] = x;
  }
  __syncthreads();
  // Forward substitution, one column per thread (columns are independent: no barriers).
  for (int col = tid; col < XP; col += kThreads) {
    float* dst = col < DK ? Wg + (int64_t(j) * Tp + t0) * DK + col : Ug + (int64_t(j) * Tp + t0) * dv + (col - DK);
    const int ld = col < DK ? DK : dv;
    for (int r = 0; r < kC; ++r) {
      const float* Ar = As + r * (kC + 1);
      float a0 = Xs[r * XP + col], a1 = 0.f;
      int s2 = 0;
      for (; s2 + 1 < r; s2 += 2) {
        a0 -= Ar[s2] * Xs[s2 * XP + col];
        a1 -= Ar[s2 + 1] * Xs[(s2 + 1) * XP + col];
      }
      if (s2 < r) a0 -= Ar[s2] * Xs[s2 * XP + col];
      const float x = a0 + a1;
      Xs[r * XP + col] = x;
      dst[int64_t(r) * ld] = x;
    }
  }
}

// Block (value head j = blockIdx.x, dv columns [32 blockIdx.y, +32)). Thread (ty, tx) owns rows
// ty + 16a (a < 4) and columns tx, tx + 16 of the 64×32 products, and state rows ty·(DK/16) + a
// (a < DK/16) of the same two columns. W and Q are dead after the first product, so the next chunk's
// W and Q stream into their buffers (cp.async) while the output and state update run.
template <int DK>
__global__ void __launch_bounds__(kThreads) state_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
    const float* __restrict__ Wg, const float* __restrict__ Ug, const float* __restrict__ Bg, const float* __restrict__ Gg,
    int T, int Hk, int Hv, int dv, float* __restrict__ S, float* __restrict__ o) {
  constexpr int P = DK + 4, PB = kC + 4, PV = kNC + 1, RA = DK / 16;  // P, PB keep rows 16-byte aligned
  extern __shared__ float4 sm4[];
  float* Ws = reinterpret_cast<float*>(sm4);  // [64][P]
  float* Qs = Ws + kC * P;                    // [64][P]
  float* Ks = Qs + kC * P;                    // [64][P]
  float* Bs = Ks + kC * P;                    // [64][PB]
  float* Vs = Bs + kC * PB;                   // [64][PV]  U, then V'
  float* Vd = Vs + kC * PV;                   // [64][PV]  V' e^{γlast-γ}
  float* Hs = Vd + kC * PV;                   // [DK][PV]  state slice H[i][c] = S[j, c0 + c, i]
  float* gam = Hs + DK * PV;                  // [64]
  const int j = blockIdx.x, c0 = blockIdx.y * kNC, tid = threadIdx.x;
  const int tx = tid & 15, ty = tid >> 4;
  const int hk = j / (Hv / Hk);
  const int nch = (T + kC - 1) / kC;
  const int64_t Tp = int64_t(nch) * kC;
  const int ncols = min(kNC, dv - c0);
  float* Sg = S + int64_t(j) * dv * DK;
  for (int e = tid; e < DK * kNC; e += kThreads) {
    const int i = e % DK, cc = e / DK;
    Hs[i * PV + cc] = cc < ncols ? Sg[int64_t(c0 + cc) * DK + i] : 0.f;
  }
  auto fetch_wq = [&](int cn) {  // W and Q rows of chunk cn into Ws, Qs (Q rows past T are zero)
    const int tn = cn * kC;
    for (int e = tid; e < kC * DK / 4; e += kThreads) {
      const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
      const bool live = tn + r < T;
      cp16(Ws + r * P + i, Wg + (int64_t(j) * Tp + tn + r) * DK + i, true);
      cp16(Qs + r * P + i, live ? qn + (int64_t(tn + r) * Hk + hk) * DK + i : qn, live);
    }
  };
  fetch_wq(0);
  for (int c = 0; c < nch; ++c) {
    const int t0 = c * kC, L = min(kC, T - t0);
    for (int e = tid; e < kC * DK / 4; e += kThreads) {
      const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
      float4 k = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < L) k = *reinterpret_cast<const float4*>(kn + (int64_t(t0 + r) * Hk + hk) * DK + i);
      *reinterpret_cast<float4*>(Ks + r * P + i) = k;
    }
    const float* Bc = Bg + (int64_t(j) * nch + c) * kC * kC;
    for (int e = tid; e < kC * kC / 4; e += kThreads) {
      const int r = e / (kC / 4), i = 4 * (e % (kC / 4));
      *reinterpret_cast<float4*>(Bs + r * PB + i) = *reinterpret_cast<const float4*>(Bc + r * kC + i);
    }
    for (int e = tid; e < kC * kNC; e += kThreads) {
      const int r = e / kNC, cc = e % kNC;
      Vs[r * PV + cc] = cc < ncols ? Ug[(int64_t(j) * Tp + t0 + r) * dv + c0 + cc] : 0.f;
    }
    if (tid < kC) gam[tid] = Gg[int64_t(j) * Tp + t0 + tid];
    cp_wait_all();
    __syncthreads();
    // V' = U - W H and Q H
    float wh[4][2] = {}, qh[4][2] = {};
#pragma unroll 2
    for (int i = 0; i < DK; i += 4) {
      float h[4][2];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        h[u][0] = Hs[(i + u) * PV + tx];
        h[u][1] = Hs[(i + u) * PV + tx + 16];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float4 w = *reinterpret_cast<const float4*>(Ws + (ty + 16 * a) * P + i);
        const float4 q = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * P + i);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          wh[a][b] += w.x * h[0][b] + w.y * h[1][b] + w.z * h[2][b] + w.w * h[3][b];
          qh[a][b] += q.x * h[0][b] + q.y * h[1][b] + q.z * h[2][b] + q.w * h[3][b];
        }
      }
    }
    const float gl = gam[kC - 1];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r = ty + 16 * a;
      const float dr = expf(gl - gam[r]);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int cc = tx + 16 * b;
        const float v = Vs[r * PV + cc] - wh[a][b];  // only this thread reads or writes (r, cc) in this phase
        Vs[r * PV + cc] = v;
        Vd[r * PV + cc] = v * dr;
      }
    }
    __syncthreads();
    if (c + 1 < nch) fetch_wq(c + 1);
    // o = e^γ (Q H) + B V'; rows r of this thread have B[r][s] = 0 for s > r, so s stops at ty + 48.
    float ov[4][2];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float er = expf(gam[ty + 16 * a]);
      ov[a][0] = er * qh[a][0];
      ov[a][1] = er * qh[a][1];
    }
    for (int s2 = 0; s2 <= ty + 48; s2 += 4) {
      float v[4][2];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        v[u][0] = Vs[(s2 + u) * PV + tx];
        v[u][1] = Vs[(s2 + u) * PV + tx + 16];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float4 bq = *reinterpret_cast<const float4*>(Bs + (ty + 16 * a) * PB + s2);
#pragma unroll
        for (int b = 0; b < 2; ++b) ov[a][b] += bq.x * v[0][b] + bq.y * v[1][b] + bq.z * v[2][b] + bq.w * v[3][b];
      }
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r = ty + 16 * a;
      if (r >= L) continue;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int cc = tx + 16 * b;
        if (cc < ncols) o[int64_t(t0 + r) * Hv * dv + int64_t(j) * dv + c0 + cc] = ov[a][b];
      }
    }
    // H <- e^{γlast} H + Kᵀ Vd on this thread's state entries (rows ty·RA + a, columns tx, tx + 16)
    float hn[RA][2] = {};
#pragma unroll 4
    for (int r = 0; r < kC; ++r) {
      const float d0 = Vd[r * PV + tx], d1 = Vd[r * PV + tx + 16];
#pragma unroll
      for (int a = 0; a < RA; a += 2) {
        const float2 k = *reinterpret_cast<const float2*>(Ks + r * P + ty * RA + a);
        hn[a][0] += k.x * d0;
        hn[a][1] += k.x * d1;
        hn[a + 1][0] += k.y * d0;
        hn[a + 1][1] += k.y * d1;
      }
    }
    const float el = expf(gl);
#pragma unroll
    for (int a = 0; a < RA; ++a) {
      const int i = ty * RA + a;
      Hs[i * PV + tx] = el * Hs[i * PV + tx] + hn[a][0];
      Hs[i * PV + tx + 16] = el * Hs[i * PV + tx + 16] + hn[a][1];
    }
    __syncthreads();
  }
  for (int e = tid; e < DK * kNC; e += kThreads) {
    const int i = e % DK, cc = e / DK;
    if (cc < ncols) Sg[int64_t(c0 + cc) * DK + i] = Hs[i * PV + cc];
  }
}

template <int DK>
void set_limits() {
  LILY_CU(cudaFuncSetAttribute(wy_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
  LILY_CU(cudaFuncSetAttribute(state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
}

template <int DK>
void launch(const float* qn, const float* kn, const float* xc, const float* g, const float* beta, int T, int Hk, int Hv,
            int dv, float* S, float* o, const ChunkScratch& sc, cudaStream_t s) {
  const int nch = int(cdiv(T, kC));
  wy_kernel<DK><<<dim3(nch, Hv), kThreads, wy_smem(DK, dv), s>>>(qn, kn, xc, g, beta, T, Hk, Hv, dv, sc.W, sc.U, sc.B, sc.G);
  LILY_CU_LAUNCH();
  state_kernel<DK><<<dim3(Hv, cdiv(dv, kNC)), kThreads, state_smem(DK), s>>>(qn, kn, sc.W, sc.U, sc.B, sc.G, T, Hk, Hv, dv, S, o);
  LILY_CU_LAUNCH();
}

}  // namespace

bool gdn_chunk_fast_covers(int dk, int dv) {
  return g_enabled && (dk == 32 || dk == 64 || dk == 128) && dv >= 1 && wy_smem(dk, dv) <= size_t(g_smem_limit) &&
         state_smem(dk) <= size_t(g_smem_limit);
}

void gdn_chunk_fast_enable(bool on) { g_enabled = on; }

size_t gdn_chunk_scratch_bytes(int T, int Hv, int dk, int dv) { return chunk_layout(T, Hv, dk, dv, nullptr).bytes; }

void init_gdn_chunk_kernels() {
  int dev = 0, optin = 0;
  LILY_CU(cudaGetDevice(&dev));
  LILY_CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  g_smem_limit = std::min(kSmemWanted, optin);
  set_limits<32>();
  set_limits<64>();
  set_limits<128>();
}

void gdn_chunk_fast(const float* qn, const float* kn, const float* xc, const float* g, const float* beta, int T, int Hk,
                    int Hv, int dk, int dv, float* S, float* o, void* scratch, cudaStream_t s) {
  if (T <= 0) return;
  if (!gdn_chunk_fast_covers(dk, dv) || Hk <= 0 || Hv % Hk != 0) fail_internal("gdn_chunk_fast: shape not covered");
  const ChunkScratch sc = chunk_layout(T, Hv, dk, dv, scratch);
  switch (dk) {
    case 32: launch<32>(qn, kn, xc, g, beta, T, Hk, Hv, dv, S, o, sc, s); break;
    case 64: launch<64>(qn, kn, xc, g, beta, T, Hk, Hv, dv, S, o, sc, s); break;
    default: launch<128>(qn, kn, xc, g, beta, T, Hk, Hv, dv, S, o, sc, s); break;
  }
}

}  // namespace lily::cuda
