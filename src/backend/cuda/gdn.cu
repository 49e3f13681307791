// Gated DeltaNet core (model doc §3.4 steps 2-7, §4): causal depthwise conv + SiLU with a carried conv
// state, L2 norms, gates, the delta rule with an fp32 state [Hv, dv, dk], and the gated RMSNorm.
// Decode and short steps (sm_90): the fused kernel of gdn_step.cu; other devices and shapes: conv, then
// one warp per (value head, dv row), then the gated norm, as separate kernels. Prompts: the chunked rule
// (C = 64, §4.1), one block per (value head, 32-column slice of dv) carrying its state slice in shared
// memory from chunk to chunk.
#include <cmath>

#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/gdn_internal.cuh"

namespace lily::cuda {

GdnScratch gdn_layout(const GdnDev& d, int T, void* base) {
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

namespace {

constexpr int kChunk = 64;
constexpr int kSlice = 32;
constexpr int kChunkMaxDk = 128;  // shared memory of the chunk kernel grows with dk

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

size_t chunk_smem(int dk) {
  return sizeof(float) * (size_t(3) * kChunk * (dk + 1) + size_t(kChunk) * (kSlice + 1) + size_t(2) * kChunk * (kChunk + 1) +
                          size_t(dk) * (kSlice + 1) + 2 * kChunk);
}

}  // namespace

void init_gdn_kernels() {
  LILY_CU(cudaFuncSetAttribute(chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(chunk_smem(kChunkMaxDk))));
  init_gdn_chunk_kernels();
}

size_t gdn_scratch_bytes(const GdnDev& g, int T) {
  return gdn_layout(g, T, nullptr).bytes + gdn_chunk_scratch_bytes(T, g.Hv, g.dk, g.dv);  // the chunk pass's part last
}

void gdn_core(const GdnDev& g, float* proj, int T, float* conv_state, float* S, float* out, void* scratch,
              cudaStream_t s, int chunk_min, const GdnBa* ba) {
  if (T <= 0) return;
  if (!(g.K >= 1 && g.K <= 8 && g.Hv % g.Hk == 0)) fail_internal("gdn_core: bad dimensions");
  GdnScratch sc = gdn_layout(g, T, scratch);
  const int C = g.C();
  const int64_t ldp = g.proj_width();
  const StepSplit sp = T < chunk_min && T <= kFusedMaxT ? gdn_fused_split(g) : StepSplit{};
  const bool step = sp.ns > 0 && (reinterpret_cast<uintptr_t>(S) & 15) == 0;
  BaFold fold;
  if (ba) {
    const Mat& W = *ba->W;
    if (step && T <= kBaFoldRows && gdn_fold_fits(*ba)) {
      fold.w = W.w; fold.ld = W.ld; fold.H = ba->in; fold.x = ba->x; fold.ldx = ba->ldx; fold.norm_w = ba->norm_w;
      fold.eps = ba->eps;
    } else {
      linear(W, 2 * g.Hv, ba->in, ba->x, ba->ldx, T, proj + C + int64_t(g.Hv) * g.dv, ldp, false, s, ba->norm_w, ba->eps);
    }
  }
  if (step) {
    gdn_launch_step(g, sp, proj, T, conv_state, S, out, fold, StepSeqs{}, nullptr, 1, s);
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

}  // namespace lily::cuda
