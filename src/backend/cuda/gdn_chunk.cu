// Chunked gated delta rule (model doc §4, chunks of 64 rows) in three passes:
//   wy pass, one block per (chunk, value head), all chunks at once: cumulative log-decay γ, the strict
//     lower A = β_r (k_r·k_s) e^{γr-γs} and the causal B = (q_r·k_s) e^{γr-γs}; forward substitution
//     (I + A)[W | U] = [β e^γ K | β V] with each column in registers. W, U, B, γ go to scratch.
//   state pass, one block per (value head, 32 columns of dv), serial over chunks with the state slice
//     H [dk, 32] in shared memory and the next chunk's W, K, U, γ streaming in (cp.async):
//     Hc = H (kept for the output pass), V' = U - W H (over U), H <- e^{γlast} H + (K e^{γlast-γ})ᵀ V'.
//   output pass, one block per (chunk, value head, 64 columns), all chunks at once:
//     o = e^γ (Q Hc) + B V'.
// Only the state recurrence is serial; it carries half the products of the rule. Arithmetic is fp32
// throughout (SIMT FMA, register tiles from shared memory): the forward substitution amplifies operand
// rounding by up to ‖(I + A)⁻¹‖, and the state is carried over every chunk of the prompt, so both stay
// at the accuracy of the reference kernel.
#include <algorithm>

#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda {
namespace {

constexpr int kC = 64;        // rows per chunk
constexpr int kNC = 32;       // dv columns per state-pass block (one per lane)
constexpr int kOC = 64;       // dv columns per output-pass block
constexpr int kWyThreads = 256, kStateThreads = 512, kOutThreads = 256;
constexpr int kSmemWanted = 200 * 1024;  // opt-in dynamic shared memory asked for (Hopper allows 227 KiB)
int g_smem_limit = kSmemWanted;         // lowered to the device's opt-in maximum by init_gdn_chunk_kernels
bool g_enabled = true;

struct ChunkScratch {
  float *W, *U, *B, *G, *Hc;
  size_t bytes;
};

ChunkScratch chunk_layout(int T, int Hv, int dk, int dv, void* base) {
  ChunkScratch s{};
  const size_t nch = cdiv(T, kC), Tp = nch * kC;
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t n) { char* r = p ? p + off : nullptr; off += (n * sizeof(float) + 255) & ~size_t(255); return reinterpret_cast<float*>(r); };
  s.W = take(size_t(Hv) * Tp * dk);        // [Hv][Tp][dk]
  s.U = take(size_t(Hv) * Tp * dv);        // [Hv][Tp][dv]: U, then V' after the state pass
  s.B = take(size_t(Hv) * nch * kC * kC);  // [Hv][nch][64][64], zero above the diagonal
  s.G = take(size_t(Hv) * Tp);             // [Hv][Tp] γ, cumulative within each chunk
  s.Hc = take(size_t(Hv) * nch * dk * dv); // [Hv][nch][dk][dv] state at the start of each chunk
  s.bytes = off;
  return s;
}

// Row pitches (floats): P for [64][dk] tiles read as float4 rows; kAP for Aᵀ.
constexpr int pitch(int dk) { return dk + 4; }
constexpr int kAP = kC + 4;

constexpr int wy_qa(int dk) { return pitch(dk) > kAP ? pitch(dk) : kAP; }  // Q, then Aᵀ, share one region

size_t wy_smem(int dk, int dv) {
  return sizeof(float) * (size_t(kC) * (wy_qa(dk) + pitch(dk)) + size_t(kC) * dv + 3 * kC);
}
size_t state_smem(int dk) {
  return sizeof(float) * (size_t(4) * kC * pitch(dk) + size_t(3) * kC * kNC + size_t(dk) * kNC + 2 * kC);
}
size_t out_smem(int dk) {
  return sizeof(float) * (size_t(kC) * pitch(dk) + size_t(dk) * kOC + size_t(kC) * kC + size_t(kC) * kOC + kC);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Block (chunk c = blockIdx.x, value head j = blockIdx.y). Products: thread (ty, tx) = (tid / 16, tid % 16)
// owns the 4×4 entries (ty + 16a, tx + 16b) of the 64×64 K Kᵀ and Q Kᵀ. Forward substitution: one column
// of [W | U] per thread, its 64 rows in registers; Aᵀ (over Q) is read as broadcasts, so the solve needs no
// barrier.
template <int DK>
__global__ void __launch_bounds__(kWyThreads, 2) wy_kernel(const float* __restrict__ qn, const float* __restrict__ kn,
    const float* __restrict__ xc, const float* __restrict__ g, const float* __restrict__ beta, int T, int Hk, int Hv,
    int dv, float* __restrict__ Wg, float* __restrict__ Ug, float* __restrict__ Bg, float* __restrict__ Gg) {
  constexpr int P = pitch(DK);
  extern __shared__ float4 sm4[];
  float* Qs = reinterpret_cast<float*>(sm4);  // [64][P], then Aᵀ [64][kAP]
  float* Ks = Qs + kC * wy_qa(DK);            // [64][P]
  float* Vs = Ks + kC * P;                    // [64][dv]
  float* gam = Vs + kC * dv;                  // [64] γ
  float* bet = gam + kC;                      // [64] β
  float* fk = bet + kC;                       // [64] β e^γ
  float* At = Qs;
  const int c = blockIdx.x, j = blockIdx.y, tid = threadIdx.x;
  const int t0 = c * kC, L = min(kC, T - t0);
  const int hk = j / (Hv / Hk);
  const int Cw = 2 * Hk * DK + Hv * dv;
  const int64_t Tp = int64_t(gridDim.x) * kC;
  for (int e = tid; e < kC * DK / 4; e += kWyThreads) {
    const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
    const bool live = r < L;
    const int64_t src = live ? (int64_t(t0 + r) * Hk + hk) * DK + i : 0;
    cp_async16(smem_u32(Qs + r * P + i), qn + src, live);
    cp_async16(smem_u32(Ks + r * P + i), kn + src, live);
  }
  for (int e = tid; e < kC * dv / 4; e += kWyThreads) {
    const int r = e / (dv / 4), i = 4 * (e % (dv / 4));
    const bool live = r < L;
    cp_async16(smem_u32(Vs + r * dv + i), live ? xc + int64_t(t0 + r) * Cw + 2 * Hk * DK + int64_t(j) * dv + i : xc, live);
  }
  cp_async_commit();
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
  cp_async_wait_all();
  __syncthreads();
  if (tid < kC) {
    Gg[int64_t(j) * Tp + t0 + tid] = gam[tid];
    fk[tid] = bet[tid] * expf(gam[tid]);
  }
  const int tx = tid & 15, ty = tid >> 4;
  float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 1
  for (int i = 0; i < DK; i += 4) {
    float4 ka[4], qa[4], kb[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      ka[a] = *reinterpret_cast<const float4*>(Ks + (ty + 16 * a) * P + i);
      qa[a] = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * P + i);
      kb[a] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * a) * P + i);
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        kk[a][b] += dot4(ka[a], kb[b]);
        qk[a][b] += dot4(qa[a], kb[b]);
      }
  }
  __syncthreads();  // Q is dead: Aᵀ goes over it
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
      At[s2 * kAP + r] = av;
      Bc[r * kC + s2] = bv;
    }
  __syncthreads();
  // x_r = f_r X[r][col] - Σ_{s<r} A[r][s] x_s in row blocks of 16 held in registers; solved rows go back
  // over X (only this thread reads its column), A[r][s] = Aᵀ[s][r] is read as broadcasts four rows at a time
  for (int col = tid; col < DK + dv; col += kWyThreads) {
    const bool isw = col < DK;
    float* xcol = isw ? Ks + col : Vs + (col - DK);
    const int ld = isw ? P : dv;
    const float* f = isw ? fk : bet;
    float* dst = isw ? Wg + (int64_t(j) * Tp + t0) * DK + col : Ug + (int64_t(j) * Tp + t0) * dv + (col - DK);
    const int ldd = isw ? DK : dv;
#pragma unroll 1
    for (int r0 = 0; r0 < kC; r0 += 16) {
      float x[16];
#pragma unroll
      for (int u = 0; u < 16; ++u) x[u] = f[r0 + u] * xcol[(r0 + u) * ld];
#pragma unroll 2
      for (int s2 = 0; s2 < r0; ++s2) {
        const float xs = xcol[s2 * ld];
        const float* as = At + s2 * kAP + r0;
#pragma unroll
        for (int u = 0; u < 16; u += 4) {
          const float4 a4 = *reinterpret_cast<const float4*>(as + u);
          x[u] -= a4.x * xs;
          x[u + 1] -= a4.y * xs;
          x[u + 2] -= a4.z * xs;
          x[u + 3] -= a4.w * xs;
        }
      }
#pragma unroll
      for (int v = 0; v < 15; ++v) {
        const float* as = At + (r0 + v) * kAP + r0;
#pragma unroll
        for (int u = v + 1; u < 16; ++u) x[u] -= as[u] * x[v];
      }
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        xcol[(r0 + u) * ld] = x[u];
        dst[int64_t(r0 + u) * ldd] = x[u];
      }
    }
  }
}

// Block (value head j = blockIdx.x, dv columns [32 blockIdx.y, +32)), 512 threads: lane tx = column,
// ty = warp. W H: rows ty + 16a (a < 4); state update: rows ty·RA + a (a < RA) of H. Chunk c + 1's W, K, U
// and γ are copied into the other buffer while chunk c runs; two barriers per chunk.
template <int DK>
__global__ void __launch_bounds__(kStateThreads, 1) state_kernel(const float* __restrict__ kn,
    const float* __restrict__ Wg, float* __restrict__ Ug, const float* __restrict__ Gg, int T, int Hk, int Hv, int dv,
    float* __restrict__ S, float* __restrict__ Hc) {
  constexpr int P = pitch(DK), RA = DK / 16;
  extern __shared__ float4 sm4[];
  float* Wb = reinterpret_cast<float*>(sm4);  // [2][64][P]
  float* Kb = Wb + 2 * kC * P;                // [2][64][P]
  float* Ub = Kb + 2 * kC * P;                // [2][64][32]
  float* Vd = Ub + 2 * kC * kNC;              // [64][32]  V' e^{γlast-γ}
  float* Hs = Vd + kC * kNC;                  // [DK][32]  H[i][c] = S[j, c0 + c, i]
  float* Gb = Hs + DK * kNC;                  // [2][64]
  const int j = blockIdx.x, c0 = blockIdx.y * kNC, tid = threadIdx.x;
  const int tx = tid & 31, ty = tid >> 5;
  const int hk = j / (Hv / Hk);
  const int nch = (T + kC - 1) / kC;
  const int64_t Tp = int64_t(nch) * kC;
  const int ncols = min(kNC, dv - c0);
  float* Sg = S + int64_t(j) * dv * DK;
  auto fetch = [&](int cn) {
    const int tn = cn * kC, L = min(kC, T - tn), b = cn & 1;
    float* W = Wb + b * kC * P;
    float* K = Kb + b * kC * P;
    for (int e = tid; e < kC * DK / 4; e += kStateThreads) {
      const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
      const bool live = r < L;
      cp_async16(smem_u32(W + r * P + i), Wg + (int64_t(j) * Tp + tn + r) * DK + i, true);
      cp_async16(smem_u32(K + r * P + i), live ? kn + (int64_t(tn + r) * Hk + hk) * DK + i : kn, live);
    }
    for (int e = tid; e < kC * kNC / 4; e += kStateThreads) {
      const int r = e / (kNC / 4), i = 4 * (e % (kNC / 4));
      const bool live = i < ncols;
      cp_async16(smem_u32(Ub + (b * kC + r) * kNC + i), live ? Ug + (int64_t(j) * Tp + tn + r) * dv + c0 + i : Ug, live);
    }
    if (tid < kC / 4) cp_async16(smem_u32(Gb + b * kC + 4 * tid), Gg + int64_t(j) * Tp + tn + 4 * tid, true);
    cp_async_commit();
  };
  fetch(0);
  for (int e = tid; e < DK * kNC; e += kStateThreads) {
    const int i = e % DK, cc = e / DK;
    Hs[i * kNC + cc] = cc < ncols ? Sg[int64_t(c0 + cc) * DK + i] : 0.f;
  }
  for (int c = 0; c < nch; ++c) {
    const int t0 = c * kC, b = c & 1;
    const float* W = Wb + b * kC * P;
    const float* K = Kb + b * kC * P;
    const float* U = Ub + b * kC * kNC;
    const float* gam = Gb + b * kC;
    cp_async_wait_all();
    __syncthreads();
    if (c + 1 < nch) fetch(c + 1);  // the other buffer was last read before the previous barrier
    float* Hcg = Hc + (int64_t(j) * nch + c) * DK * dv + c0;
    if (tx < ncols) {
#pragma unroll 4
      for (int i = ty; i < DK; i += kStateThreads / 32) Hcg[int64_t(i) * dv + tx] = Hs[i * kNC + tx];
    }
    float wh[4] = {};
#pragma unroll 4
    for (int i = 0; i < DK; i += 4) {
      const float h0 = Hs[i * kNC + tx], h1 = Hs[(i + 1) * kNC + tx], h2 = Hs[(i + 2) * kNC + tx], h3 = Hs[(i + 3) * kNC + tx];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const float4 w = *reinterpret_cast<const float4*>(W + (ty + 16 * a) * P + i);
        wh[a] += w.x * h0 + w.y * h1 + w.z * h2 + w.w * h3;
      }
    }
    const float gl = gam[kC - 1];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r = ty + 16 * a;
      const float v = U[r * kNC + tx] - wh[a];
      if (tx < ncols) Ug[(int64_t(j) * Tp + t0 + r) * dv + c0 + tx] = v;
      Vd[r * kNC + tx] = v * expf(gl - gam[r]);
    }
    __syncthreads();
    float hn[RA] = {};
#pragma unroll 4
    for (int r = 0; r < kC; ++r) {
      const float d = Vd[r * kNC + tx];
      if constexpr (RA % 4 == 0) {
#pragma unroll
        for (int a = 0; a < RA; a += 4) {
          const float4 k = *reinterpret_cast<const float4*>(K + r * P + ty * RA + a);
          hn[a] += k.x * d;
          hn[a + 1] += k.y * d;
          hn[a + 2] += k.z * d;
          hn[a + 3] += k.w * d;
        }
      } else {
#pragma unroll
        for (int a = 0; a < RA; a += 2) {
          const float2 k = *reinterpret_cast<const float2*>(K + r * P + ty * RA + a);
          hn[a] += k.x * d;
          hn[a + 1] += k.y * d;
        }
      }
    }
    const float el = expf(gl);
#pragma unroll
    for (int a = 0; a < RA; ++a) {
      const int i = ty * RA + a;
      Hs[i * kNC + tx] = el * Hs[i * kNC + tx] + hn[a];
    }
  }
  __syncthreads();
  for (int e = tid; e < DK * kNC; e += kStateThreads) {
    const int i = e % DK, cc = e / DK;
    if (cc < ncols) Sg[int64_t(c0 + cc) * DK + i] = Hs[i * kNC + cc];
  }
}

// Block (chunk c = blockIdx.x, value head j = blockIdx.y, dv columns [64 blockIdx.z, +64)): thread
// (ty, tx) = (warp, lane) owns rows ty + 8a (a < 8) and columns tx, tx + 32.
template <int DK>
__global__ void __launch_bounds__(kOutThreads, 2) out_kernel(const float* __restrict__ qn, const float* __restrict__ Hc,
    const float* __restrict__ Bg, const float* __restrict__ Ug, const float* __restrict__ Gg, int T, int Hk, int Hv,
    int dv, float* __restrict__ o) {
  constexpr int P = pitch(DK);
  extern __shared__ float4 sm4[];
  float* Qs = reinterpret_cast<float*>(sm4);  // [64][P]
  float* Hs = Qs + kC * P;                    // [DK][64]
  float* Bs = Hs + DK * kOC;                  // [64][64]
  float* Vs = Bs + kC * kC;                   // [64][64]  V'
  float* gam = Vs + kC * kOC;                 // [64]
  const int c = blockIdx.x, j = blockIdx.y, c0 = blockIdx.z * kOC, tid = threadIdx.x;
  const int tx = tid & 31, ty = tid >> 5;
  const int nch = gridDim.x, t0 = c * kC, L = min(kC, T - t0);
  const int hk = j / (Hv / Hk);
  const int64_t Tp = int64_t(nch) * kC;
  const int ncols = min(kOC, dv - c0);
  for (int e = tid; e < kC * DK / 4; e += kOutThreads) {
    const int r = e / (DK / 4), i = 4 * (e % (DK / 4));
    const bool live = r < L;
    cp_async16(smem_u32(Qs + r * P + i), live ? qn + (int64_t(t0 + r) * Hk + hk) * DK + i : qn, live);
  }
  const float* Hcg = Hc + (int64_t(j) * nch + c) * DK * dv + c0;
  for (int e = tid; e < DK * kOC / 4; e += kOutThreads) {
    const int i = e / (kOC / 4), q = 4 * (e % (kOC / 4));
    const bool live = q < ncols;
    cp_async16(smem_u32(Hs + i * kOC + q), live ? Hcg + int64_t(i) * dv + q : Hc, live);
  }
  const float* Bc = Bg + (int64_t(j) * nch + c) * kC * kC;
  for (int e = tid; e < kC * kC / 4; e += kOutThreads) cp_async16(smem_u32(Bs + 4 * e), Bc + 4 * e, true);
  const float* Ug0 = Ug + (int64_t(j) * Tp + t0) * dv + c0;
  for (int e = tid; e < kC * kOC / 4; e += kOutThreads) {
    const int r = e / (kOC / 4), q = 4 * (e % (kOC / 4));
    const bool live = q < ncols;
    cp_async16(smem_u32(Vs + r * kOC + q), live ? Ug0 + int64_t(r) * dv + q : Ug, live);
  }
  if (tid < kC / 4) cp_async16(smem_u32(gam + 4 * tid), Gg + int64_t(j) * Tp + t0 + 4 * tid, true);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  float acc[8][2] = {};
#pragma unroll 2
  for (int i = 0; i < DK; i += 4) {
    float h[4][2];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      h[u][0] = Hs[(i + u) * kOC + tx];
      h[u][1] = Hs[(i + u) * kOC + tx + 32];
    }
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const float4 q = *reinterpret_cast<const float4*>(Qs + (ty + 8 * a) * P + i);
#pragma unroll
      for (int b = 0; b < 2; ++b) acc[a][b] += q.x * h[0][b] + q.y * h[1][b] + q.z * h[2][b] + q.w * h[3][b];
    }
  }
#pragma unroll
  for (int a = 0; a < 8; ++a) {
    const float er = expf(gam[ty + 8 * a]);
    acc[a][0] *= er;
    acc[a][1] *= er;
  }
#pragma unroll 2
  for (int s2 = 0; s2 < kC; s2 += 4) {
    float v[4][2];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      v[u][0] = Vs[(s2 + u) * kOC + tx];
      v[u][1] = Vs[(s2 + u) * kOC + tx + 32];
    }
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const float4 bq = *reinterpret_cast<const float4*>(Bs + (ty + 8 * a) * kC + s2);
#pragma unroll
      for (int b = 0; b < 2; ++b) acc[a][b] += bq.x * v[0][b] + bq.y * v[1][b] + bq.z * v[2][b] + bq.w * v[3][b];
    }
  }
#pragma unroll
  for (int a = 0; a < 8; ++a) {
    const int r = ty + 8 * a;
    if (r >= L) continue;
    float* orow = o + int64_t(t0 + r) * Hv * dv + int64_t(j) * dv + c0;
    if (tx < ncols) orow[tx] = acc[a][0];
    if (tx + 32 < ncols) orow[tx + 32] = acc[a][1];
  }
}

template <int DK>
void set_limits() {
  LILY_CU(cudaFuncSetAttribute(wy_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
  LILY_CU(cudaFuncSetAttribute(state_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
  LILY_CU(cudaFuncSetAttribute(out_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
}

template <int DK>
void launch(const float* qn, const float* kn, const float* xc, const float* g, const float* beta, int T, int Hk, int Hv,
            int dv, float* S, float* o, const ChunkScratch& sc, cudaStream_t s) {
  const int nch = int(cdiv(T, kC));
  wy_kernel<DK><<<dim3(nch, Hv), kWyThreads, wy_smem(DK, dv), s>>>(qn, kn, xc, g, beta, T, Hk, Hv, dv, sc.W, sc.U, sc.B, sc.G);
  LILY_CU_LAUNCH();
  state_kernel<DK><<<dim3(Hv, cdiv(dv, kNC)), kStateThreads, state_smem(DK), s>>>(kn, sc.W, sc.U, sc.G, T, Hk, Hv, dv, S, sc.Hc);
  LILY_CU_LAUNCH();
  out_kernel<DK><<<dim3(nch, Hv, cdiv(dv, kOC)), kOutThreads, out_smem(DK), s>>>(qn, sc.Hc, sc.B, sc.U, sc.G, T, Hk, Hv, dv, o);
  LILY_CU_LAUNCH();
}

}  // namespace

bool gdn_chunk_fast_covers(int dk, int dv) {
  return g_enabled && (dk == 32 || dk == 64 || dk == 128) && dv >= 4 && dv % 4 == 0 &&
         wy_smem(dk, dv) <= size_t(g_smem_limit) && state_smem(dk) <= size_t(g_smem_limit) &&
         out_smem(dk) <= size_t(g_smem_limit);
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
