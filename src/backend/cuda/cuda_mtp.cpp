// CudaBackend: the MTP block (model doc §5, backend/backend.h's Step::mtp). Its decoder layer is uploaded
// like every other layer (any format the layers take) as layers_[cfg.layers] and runs through the same
// attention and FFN blocks, with the MTP layer's KV cache in the slot table's MTP row; here the weights of
// the block's ends, its embed block (fc over the normed embedding and hidden input), the rows kept for it
// (main steps' post-final-norm rows, MTP steps' h'), and the sequence's MTP counters.
#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/mtp.h"
#include "core/error.h"

namespace lily::cuda {

void CudaBackend::upload_mtp() {
  const MtpWeights& m = *w_->mtp;
  const int H = int(w_->cfg.hidden);
  if (m.layer.kind != LayerKind::FullAttention)
    fail("CUDA backend: the MTP layer ({}layers.0) must be a full-attention layer", m.prefix);
  layers_.emplace_back();
  upload_layer(m.layer, layers_.back(), int(w_->cfg.layers));
  mtp_fc_ = upload(m.fc);
  mtp_fc_.cls = kProdMtpFc;
  mtp_norm_e_ = upload_f32(m.norm_embed);
  mtp_norm_h_ = upload_f32(m.norm_hidden);
  mtp_norm_ = upload_f32(m.final_norm);
  max_proj_ = std::max(max_proj_, 2 * H);  // the block's input rows [T][2H] are staged in proj_
}

// x = fc([RMSNorm(embed[token]) ‖ RMSNorm(hidden input)]) per row.
void CudaBackend::mtp_embed() {
  const int H = int(w_->cfg.hidden);
  cuda::embed(embed_, H, d_tokens(), T_, x_, stream_, d_row_group(), d_groups(), fed_);
  mtp_inputs(x_, mtp_norm_e_, mtp_norm_h_, H, float(w_->cfg.rms_eps), d_i32(lay_.hidden), T_, d_row_group(), d_groups(),
             seqs(int(w_->cfg.layers)).slots, proj_, 2 * int64_t(H), stream_);
  linear(mtp_fc_, H, 2 * H, proj_, 2 * int64_t(H), T_, x_, H, false, stream_);
}

void CudaBackend::keep_hidden() {
  if (!w_->mtp) return;
  const int H = int(w_->cfg.hidden);
  const float eps = float(w_->cfg.rms_eps);
  const DevSlotLayer* slots = seqs(int(w_->cfg.layers)).slots;
  if (mtp_)  // h' of each group's last row: the hidden input of its sequence's next chain row
    keep_rows(x_, mtp_norm_, H, eps, KeepMode::Last, int(groups_.size()), d_row_group(), d_groups(), slots, stream_);
  else if (keep_)
    keep_rows(x_, final_norm_, H, eps, KeepMode::Rows, T_, d_row_group(), d_groups(), slots, stream_);
}

void CudaState::truncate_mtp(int64_t n) {
  if (n < 0 || n > mtp_n_) throw InternalError(fmt::format("truncate_mtp({}) with {} MTP rows", n, mtp_n_));
  mtp_n_ = n;  // KV rows past mtp_n_ are never read
}

void CudaState::ensure_hidden(int64_t rows) {
  if (rows <= hidden_cap_) return;
  if (!hprime_) throw InternalError("kept hidden rows (MTP) on a model without an MTP block");
  const int64_t cap = std::max<int64_t>(rows, kMaxTentativeRows);
  dev_->sync();  // queued MTP steps may still read the old rows
  dev_->free(hidden_, 4 * size_t(hidden_cap_) * size_t(H_));
  hidden_ = nullptr;
  hidden_cap_ = 0;
  hidden_ = static_cast<float*>(dev_->alloc(4 * size_t(cap) * size_t(H_)));
  hidden_cap_ = cap;
  const size_t L = size_t(be_.w_->cfg.layers);
  const DevSlotLayer e = table_entry(L);
  be_.upload_async(be_.slot_tab_ + L * size_t(be_.slot_cap_) + size_t(slot_), &e, sizeof(DevSlotLayer));
}

}  // namespace lily::cuda
