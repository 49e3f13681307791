// CudaBackend: the blocks of backend/backend.h over the rows of the current step. Projections, norms and
// the MoE run over all rows at once; the mixers' per-sequence parts read each row's slot and position from
// the step descriptor and the slot table on the device: short groups batched in one launch per layer
// (decode attention, the DeltaNet step), long groups through the prompt kernels one launch each.
#include "backend/cuda/cuda_impl.h"
#include "core/error.h"

namespace lily::cuda {

void CudaBackend::embed() {
  if (capture_) begin_capture();
  if (replay_) return;
  mark(-1, "embed");
  if (mk_) return mk_embed();    // mk_backend.cpp: ops of the step kernel
  if (mtp_) return mtp_embed();  // cuda_mtp.cpp
  cuda::embed(embed_, int(w_->cfg.hidden), d_tokens(), T_, x_, stream_, d_row_group(), d_groups(), fed_);
}

void CudaBackend::gdn_mixer(int layer) {
  if (replay_) return;
  mark(layer, "gdn");
  if (mk_) return mk_gdn(layer);
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const GdnDev& g = D.gdn;
  const int PW = g.proj_width();
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= fuse_rows();  // the products normalise x themselves
  if (!fuse) rmsnorm(x_, H, D.in_norm, T_, H, eps, u_, H, stream_);
  int c0 = 0;
  GdnBa ba;
  const GdnBa* bap = nullptr;
  for (auto& [m, rows] : D.gdn_in) {
    if (ba_groups_ && c0 == g.C() + g.Hv * g.dv && rows == 2 * g.Hv) {
      // b|a in a format of its own, every group at most kBaFoldRows rows: inside the step kernel where it fits
      ba.W = &m; ba.in = H; ba.x = fuse ? x_ : u_; ba.ldx = H; ba.norm_w = fuse ? D.in_norm : nullptr; ba.eps = eps;
      bap = &ba;
    } else {
      linear(m, rows, H, fuse ? x_ : u_, H, T_, proj_ + c0, PW, false, stream_, fuse ? D.in_norm : nullptr, eps);
    }
    c0 += rows;
  }
  const size_t l = size_t(layer);
  gdn_groups(g, proj_, T_, seqs(layer), d_i32(lay_.gdn_short), n_gdn_short_, d_i32(lay_.gdn_short_rows), n_gdn_short_rows_,
             core_, work_, stream_, bap);
  for (const Group& gr : groups_) {  // long groups: the chunked rule (or the plain recurrence), one call each
    if (gr.gdn_short) continue;
    CudaState& st = *gr.st;
    gdn_core(g, proj_ + int64_t(gr.first) * PW, gr.rows, st.conv_at(l, st.cur_), st.S_at(l, st.cur_),
             core_ + int64_t(gr.first) * g.Hv * g.dv, work_, stream_, opt_.chunk_min, nullptr);
  }
  linear(D.gdn_out, H, g.Hv * g.dv, core_, g.Hv * g.dv, T_, rank_out_ ? rank_out_ : x_, H, !rank_out_, stream_);
}

void CudaBackend::attn_mixer(int layer) {
  if (replay_) return;
  mark(layer, "attn");
  if (mk_) return mk_attn(layer);
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const AttnDev& a = D.attn;
  const int PW = a.proj_width();
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= fuse_rows();
  if (!fuse) rmsnorm(x_, H, D.in_norm, T_, H, eps, u_, H, stream_);
  int c0 = 0;
  for (auto& [m, rows] : D.attn_in) {
    linear(m, rows, H, fuse ? x_ : u_, H, T_, proj_ + c0, PW, false, stream_, fuse ? D.in_norm : nullptr, eps);
    c0 += rows;
  }
  // q and the KV append of every row at its slot and position; then the short groups in one launch, the
  // long ones through the prompt kernels one by one
  auto* q = static_cast<float*>(work_);
  void* part = static_cast<char*>(work_) + attn_q_bytes(a, T_);
  const StepSeqs sq = seqs(layer);
  attn_prep(a, proj_, T_, sq, q, stream_);
  attn_decode_groups(a, q, proj_, T_, sq, d_i32(lay_.attn_short), n_attn_short_, d_i32(lay_.attn_short_rows),
                     n_attn_short_rows_, nsplit_short_, core_, part, stream_);
  const size_t l = size_t(layer);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& gr = groups_[gi];
    if (gr.attn_short) continue;
    CudaState& st = *gr.st;
    attn_rows(a, q + int64_t(gr.first) * a.Hq * a.hd, proj_ + int64_t(gr.first) * PW, gr.rows, &d_groups()[gi].pos,
              st.k[l], st.v[l], st.cap_, gr.nsplit, core_ + int64_t(gr.first) * a.Hq * a.hd, part, stream_);
  }
  linear(D.attn_o, H, a.Hq * a.hd, core_, a.Hq * a.hd, T_, rank_out_ ? rank_out_ : x_, H, !rank_out_, stream_);
}

void CudaBackend::ffn(int layer) {
  if (replay_) return;
  mark(layer, "ffn");
  if (mk_) return mk_ffn(layer);
  if (rank_) return rank_ffn(layer);  // shard_blocks.cpp
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= fuse_rows();
  if (!fuse) rmsnorm(x_, H, D.post_norm, T_, H, eps, u_, H, stream_);
  moe(D.moe, fuse ? nullptr : u_, T_, x_, work_, stream_, side_, fork_, join_, D.post_norm, eps);
}

void CudaBackend::head() {
  if (replay_) return;
  mark(-1, "head");
  if (mk_) return mk_head();
  if (rank_) return rank_head();  // shard_blocks.cpp
  keep_hidden();  // cuda_mtp.cpp: rows kept for MTP steps (before anything below changes u_)
  if (O_ == 0) return;
  const int H = int(w_->cfg.hidden), V = int(w_->cfg.vocab);
  const float eps = float(w_->cfg.rms_eps);
  const float* norm = mtp_ ? mtp_norm_ : final_norm_;  // an MTP step's logits are lm_head(h')
  const float* xr = x_ + int64_t(T_ - O_) * H;
  if (!out_tail_) {  // the groups' output rows side by side
    gather_rows(x_, H, d_out_rows(), O_, H, u_, H, stream_);
    xr = u_;
  }
  // an MTP step's draft head over ids [0, head_vocab_) (the first rows of an affine or bf16 lm_head), the rest -inf
  const int hv = head_vocab_ > 0 && head_vocab_ < V && !lm_head_.exl3 ? head_vocab_ : V;
  if (O_ <= fuse_rows()) {
    linear(lm_head_, hv, H, xr, H, O_, logits_, V, false, stream_, norm, eps);
  } else {
    rmsnorm(xr, H, norm, O_, H, eps, u_, H, stream_);  // in place when gathered (row by row)
    linear(lm_head_, hv, H, u_, H, O_, logits_, V, false, stream_);
  }
  if (hv < V) fill_cols(logits_, V, O_, hv, V, -INFINITY, stream_);
  // the drawn ids: into ids_dev_ (copied to the host in end()) and each group's fed word
  if (kind_ == 1)
    argmax(logits_, S_, V, ids_dev_, small_, stream_, d_i32(lay_.sample_src), d_i32(lay_.sample_fed), fed_);
  else if (kind_ == 2)
    sample_rows(samp_, samp_slots_, logits_, S_, d_i32(lay_.sample_src), d_i32(lay_.sample_slot), d_i32(lay_.sample_off),
                ids_dev_, stream_, d_i32(lay_.sample_fed), fed_);
}

}  // namespace lily::cuda
