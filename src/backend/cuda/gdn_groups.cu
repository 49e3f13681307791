// The short groups of a multi-sequence step (gdn.h: gdn_groups): the fused step kernel over a grid of
// groups, or for devices and shapes it does not take, conv, delta rule and gated norm as three launches
// over the groups, each reading its slot's state versions from the slot table.
#include "backend/cuda/gdn_internal.cuh"

namespace lily::cuda {
namespace {

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

}  // namespace

bool gdn_groups_fused(const GdnDev& g) { return gdn_fused_split(g).ns > 0; }

void gdn_groups(const GdnDev& g, float* proj, int T, const StepSeqs& seqs, const int32_t* list, int groups,
                const int32_t* rows, int n_rows, float* out, void* scratch, cudaStream_t s, const GdnBa* ba) {
  if (groups <= 0) return;
  if (!seqs.row_group || !list || !rows) fail_internal("gdn_groups: needs the step form and the group and row lists");
  if (!(g.K >= 1 && g.K <= 8 && g.Hv % g.Hk == 0)) fail_internal("gdn_groups: bad dimensions");
  const int C = g.C();
  const int64_t ldp = g.proj_width();
  const StepSplit sp = gdn_fused_split(g);
  BaFold fold;
  if (ba) {  // every group has at most kBaFoldRows rows (the caller's promise)
    const Mat& W = *ba->W;
    if (sp.ns > 0 && T <= groups * kBaFoldRows && gdn_fold_fits(*ba)) {
      fold.w = W.w; fold.ld = W.ld; fold.H = ba->in; fold.x = ba->x; fold.ldx = ba->ldx; fold.norm_w = ba->norm_w;
      fold.eps = ba->eps;
    } else {
      linear(W, 2 * g.Hv, ba->in, ba->x, ba->ldx, T, proj + C + int64_t(g.Hv) * g.dv, ldp, false, s, ba->norm_w, ba->eps);
    }
  }
  if (sp.ns > 0) {
    gdn_launch_step(g, sp, proj, T, nullptr, nullptr, out, fold, seqs, list, groups, s);
    return;
  }
  GdnScratch sc = gdn_layout(g, T, scratch);
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
