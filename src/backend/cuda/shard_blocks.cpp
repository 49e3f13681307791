// CudaBackend in rank mode (cuda_impl.h rank_, backend/rank_backend.h): the FFN over the rank's expert range
// and its share of the shared expert / dense MLP, written to the rank's partial; the head over the rank's
// vocabulary rows, with the distributed argmax of greedy steps.
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/rows.h"
#include "backend/cuda/shard_ops.h"
#include "backend/cuda/shard_rank.h"
#include "core/error.h"

namespace lily::cuda {

namespace {

constexpr int kGemmTile = 64;  // gemm_tiles' rows per tile (kernels.cuh kGemmBM)

bool present(const Mat& m) { return m.exl3 ? m.parts != nullptr : m.affine ? m.q != nullptr : m.w != nullptr; }

// The SwiGLU MLP `gate_up` [2I, H] / `down` [H, I] over u [T, H] into y [T, H] (written).
void swiglu_mlp(const Mat& gate_up, const Mat& down, int I, int H, const float* u, int T, const RankMoeScratch& sc,
                float* y, cudaStream_t s) {
  linear(gate_up, 2 * I, H, u, H, T, sc.sh_gu, 2 * I, false, s);
  swiglu_rows(sc.sh_gu, I, T, sc.sh_h, s);
  linear(down, H, I, sc.sh_h, I, T, y, H, false, s);
}

}  // namespace

int rank_moe_tile_rows(int T) { return T <= kRowsMax ? kRowsTile : kGemmTile; }

void CudaBackend::rank_ffn(int layer) {
  const DevLayer& D = layers_[size_t(layer)];
  const MoeDev& m = D.moe;
  const int H = int(w_->cfg.hidden), T = T_;
  const float eps = float(w_->cfg.rms_eps);
  float* y = rank_out_;
  rmsnorm(x_, H, D.post_norm, T, H, eps, u_, H, stream_);
  const bool shared = !m.shared_in_stack && present(m.sh_gate_up) && m.Is > 0;
  const int Eg = int(w_->cfg.n_experts), kk = m.moe ? m.slots_per_token() : 0;
  const int tr = rank_moe_tile_rows(T);
  const RankMoeScratch sc = rank_moe_layout(rank_->moe, T, std::max(kk, 1), Eg, m.E, m.I, m.Is, H, tr);
  if (sc.bytes > rank_->moe_bytes) throw InternalError("rank_ffn: the rank's MoE scratch is too small");
  if (!m.moe) {  // the dense MLP: this rank's share of it, or none
    if (shared) swiglu_mlp(m.sh_gate_up, m.sh_down, m.Is, H, u_, T, sc, y, stream_);
    else LILY_CU(cudaMemsetAsync(y, 0, sizeof(float) * size_t(T) * size_t(H), stream_));
    return;
  }
  // the router over every expert (the top-k is global), the slots of this rank's experts
  const int ldl = m.gate_in_router ? Eg + 1 : Eg;
  if (gemm_prec_for(m.router) == GemmPrec::kBf16) linear(m.router, ldl, H, u_, H, T, sc.logits, ldl, false, stream_);
  else linear_split(m.router, ldl, H, u_, H, T, sc.logits, ldl, stream_);
  const int e0 = int(w_->layers.size() > size_t(layer) ? w_->layers[size_t(layer)].ffn.expert0 : w_->mtp->layer.ffn.expert0);
  rank_topk(sc.logits, ldl, T, Eg, m.k, m.norm_topk, m.shared_in_stack, m.gate_in_router, e0, m.E, sc.idx, sc.w, stream_);
  const int n = T * kk, En = m.E + (m.shared_in_stack ? 1 : 0);
  rank_route(sc.idx, n, En, kk, tr, sc.counts, sc.slot_pos, sc.sorted_tok, sc.tiles, sc.n_tiles, stream_);
  const int mt = (n + tr - 1) / tr + En;
  const bool rows = tr == kRowsTile && rows_covers(m.gate_up, H) && rows_covers(m.down, m.I);
  if (rows) {
    if (!rows_product(m.gate_up, 2 * m.I, H, u_, H, sc.sorted_tok, sc.h, m.I, false, m.I, sc.tiles, sc.n_tiles, mt, n, stream_) ||
        !rows_product(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, 0, sc.tiles, sc.n_tiles, mt, n, stream_))
      throw InternalError("rank_ffn: the multi-row expert product declined an input it covers");
  } else {
    // tiles of kRowsTile rows fit the GEMM's 64-row tiles too
    gemm_tiles(m.gate_up, 2 * m.I, H, u_, H, sc.sorted_tok, sc.gu, 2 * m.I, false, sc.tiles, sc.n_tiles, mt, n, stream_);
    swiglu_rows(sc.gu, m.I, n, sc.h, stream_);
    gemm_tiles(m.down, H, m.I, sc.h, m.I, nullptr, sc.yb, H, false, sc.tiles, sc.n_tiles, mt, n, stream_);
  }
  const float* sg = nullptr;
  int sg_ld = 1;
  if (shared) {
    linear(m.sh_gate_up, 2 * m.Is, H, u_, H, T, sc.sh_gu, 2 * m.Is, false, stream_);
    swiglu_rows(sc.sh_gu, m.Is, T, sc.sh_h, stream_);
    linear(m.sh_down, H, m.Is, sc.sh_h, m.Is, T, sc.ysh, H, false, stream_);
    if (m.gate_in_router) {
      sg = sc.logits + Eg;
      sg_ld = ldl;
    } else if (present(m.sh_gate)) {
      linear(m.sh_gate, 1, H, u_, H, T, sc.sg, 1, false, stream_);
      sg = sc.sg;
    }
  }
  rank_combine(y, T, H, kk, sc.w, sc.slot_pos, sc.yb, shared ? sc.ysh : nullptr, sg, sg_ld, stream_);
}

void CudaBackend::rank_head() {
  keep_hidden();  // cuda_mtp.cpp: rows kept for MTP steps (before anything below changes u_)
  RankExt& R = *rank_;
  R.head = RankColumns{};
  R.argmax = false;
  if (O_ == 0) return;
  const int H = int(w_->cfg.hidden), V = int(w_->cfg.vocab), Vr = int(w_->lm_head.out);
  const int64_t v0 = w_->vocab0;
  const float eps = float(w_->cfg.rms_eps);
  const float* norm = mtp_ ? mtp_norm_ : final_norm_;
  const float* xr = x_ + int64_t(T_ - O_) * H;
  if (!out_tail_) {
    gather_rows(x_, H, d_out_rows(), O_, H, u_, H, stream_);
    xr = u_;
  }
  // the rank's vocabulary columns of the [O, V] logits
  if (O_ <= kGemvMaxRows) {
    linear(lm_head_, Vr, H, xr, H, O_, logits_ + v0, V, false, stream_, norm, eps);
  } else {
    rmsnorm(xr, H, norm, O_, H, eps, u_, H, stream_);
    linear(lm_head_, Vr, H, u_, H, O_, logits_ + v0, V, false, stream_);
  }
  bool host_logits = false;
  for (const Group& g : groups_) host_logits = host_logits || (g.logits && g.out_rows > 0);
  // greedy draws with no logits for the host: each rank's best of its columns, the best of those after the
  // gather (2 floats a rank and row instead of the rows)
  if (kind_ == 1 && !host_logits && R.ranks > 1) {
    if (S_ > R.cand_rows) throw InternalError("rank_head: the candidate buffer is too small");
    slice_argmax(logits_, V, v0, Vr, d_i32(lay_.sample_src), S_, R.cand, 2 * R.ranks, 2 * R.rank, stream_);
    R.head = RankColumns{R.cand, S_, 2 * R.ranks, 2 * R.rank, 2};
    R.argmax = true;
    return;
  }
  R.head = RankColumns{logits_, O_, V, v0, Vr};
}

void CudaBackend::rank_head_finish() {
  if (replay_ || O_ == 0) return;
  const RankExt& R = *rank_;
  const int V = int(w_->cfg.vocab);
  if (R.argmax)
    pick_argmax(R.cand, 2 * R.ranks, R.ranks, S_, ids_dev_, d_i32(lay_.sample_fed), fed_, stream_);
  else if (kind_ == 1)
    argmax(logits_, S_, V, ids_dev_, small_, stream_, d_i32(lay_.sample_src), d_i32(lay_.sample_fed), fed_);
  else if (kind_ == 2)
    sample_rows(samp_, samp_slots_, logits_, S_, d_i32(lay_.sample_src), d_i32(lay_.sample_slot), d_i32(lay_.sample_off),
                ids_dev_, stream_, d_i32(lay_.sample_fed), fed_);
}

}  // namespace lily::cuda
