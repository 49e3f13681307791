// The CPU backend's sequence state (SequenceState) and its snapshots: KV rows per attention layer, conv and
// recurrent state per DeltaNet layer with the checkpoint ring of tentative steps, the MTP layer's KV rows and
// the rows kept for MTP steps. CpuBackend's blocks read and write the members directly.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace lily::cpu {

class CpuSnapshot final : public StateSnapshot {
 public:
  struct Layer {
    std::vector<float> k, v, conv, ssm;
  };
  int64_t n_tokens() const override { return n; }
  size_t nbytes() const override {
    size_t b = (mtp.k.size() + mtp.v.size()) * sizeof(float);
    for (auto& L : layers) b += (L.k.size() + L.v.size() + L.conv.size() + L.ssm.size()) * sizeof(float);
    return b;
  }
  // Per layer k, v, conv, ssm; then the MTP layer's k, v.
  std::vector<float> contents() const override {
    std::vector<float> v;
    for (auto& L : layers)
      for (const auto* p : {&L.k, &L.v, &L.conv, &L.ssm}) v.insert(v.end(), p->begin(), p->end());
    v.insert(v.end(), mtp.k.begin(), mtp.k.end());
    v.insert(v.end(), mtp.v.begin(), mtp.v.end());
    return v;
  }
  const ModelConfig* cfg = nullptr;
  int64_t n = 0, mtp_n = 0;
  std::vector<Layer> layers;
  Layer mtp;  // the MTP layer's KV rows
};

class CpuState final : public SequenceState {
 public:
  struct Layer {
    std::vector<float> k, v;      // attention: [n_tokens + pending][Hkv·hd]
    std::vector<float> conv, ssm; // deltanet: R versions of [K-1][C] and of [Hv][dv][dk]
  };

  CpuState(const CpuBackend& owner, const ModelConfig& cfg, int64_t capacity) : owner_(&owner), cfg_(&cfg), capacity_(capacity) {
    conv_n_ = size_t((cfg.conv_kernel - 1) * cfg.conv_channels());
    ssm_n_ = size_t(cfg.lin_v_heads * cfg.lin_v_dim * cfg.lin_k_dim);
    layers_.resize(static_cast<size_t>(cfg.layers));
    reset();
  }
  int64_t n_tokens() const override { return n_; }
  int64_t capacity() const override { return capacity_; }
  int64_t pending() const override { return pending_; }
  int max_tentative() const override { return R_ - 1; }
  void commit(int64_t n) override {
    if (n < 0 || n > pending_)
      throw InternalError("commit(" + std::to_string(n) + ") with " + std::to_string(pending_) + " tentative rows pending");
    n_ += n;
    cur_ = ver(int(n));
    pending_ = 0;
    hidden_n_ = std::min(hidden_n_, n);
    const size_t kvw = size_t(cfg_->n_kv_heads * cfg_->head_dim);
    for (auto& L : layers_) {
      if (L.k.empty() && L.v.empty()) continue;
      L.k.resize(size_t(n_) * kvw);
      L.v.resize(size_t(n_) * kvw);
    }
  }
  void reserve_tentative(int rows) override {
    if (rows < 0 || rows > kMaxTentativeRows)
      throw InternalError("reserve_tentative(" + std::to_string(rows) + "): at most " + std::to_string(kMaxTentativeRows) + " rows");
    if (pending_ > 0) throw InternalError("reserve_tentative with tentative rows pending");
    if (rows + 1 <= R_) return;
    const int R = rows + 1;
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (cfg_->layer_kinds[l] != LayerKind::LinearAttention) continue;
      auto& L = layers_[l];
      std::vector<float> conv(conv_n_ * size_t(R), 0.0f), ssm(ssm_n_ * size_t(R), 0.0f);
      std::copy_n(conv_at(l, cur_), conv_n_, conv.begin());
      std::copy_n(ssm_at(l, cur_), ssm_n_, ssm.begin());
      L.conv = std::move(conv);
      L.ssm = std::move(ssm);
    }
    R_ = R;
    cur_ = 0;
  }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    if (pending_ > 0) throw InternalError("snapshot with tentative rows pending");
    auto s = std::make_unique<CpuSnapshot>();
    s->cfg = cfg_;
    s->n = n_;
    s->mtp_n = mtp_n_;
    s->mtp.k = mtp_kv_.k;
    s->mtp.v = mtp_kv_.v;
    s->layers.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& L = layers_[l];
      auto& D = s->layers[l];
      D.k = L.k;
      D.v = L.v;
      if (!L.conv.empty()) {
        D.conv.assign(conv_at(l, cur_), conv_at(l, cur_) + conv_n_);
        D.ssm.assign(ssm_at(l, cur_), ssm_at(l, cur_) + ssm_n_);
      }
    }
    return s;
  }
  void restore(const StateSnapshot& snap) override {
    auto* o = dynamic_cast<const CpuSnapshot*>(&snap);
    LILY_CHECK(o && o->cfg == cfg_, "snapshot belongs to another backend or model");
    if (o->n > capacity_) fail("cannot restore a snapshot of {} tokens into a context of {}", o->n, capacity_);
    n_ = o->n;
    pending_ = 0;
    mtp_n_ = o->mtp_n;
    mtp_kv_.k = o->mtp.k;
    mtp_kv_.v = o->mtp.v;
    hidden_n_ = 0;
    has_mtp_h_ = false;
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto& L = layers_[l];
      const auto& D = o->layers[l];
      L.k = D.k;
      L.v = D.v;
      if (!L.conv.empty()) {
        std::copy(D.conv.begin(), D.conv.end(), conv_at(l, cur_));
        std::copy(D.ssm.begin(), D.ssm.end(), ssm_at(l, cur_));
      }
    }
  }
  void reset() override {
    n_ = 0;
    pending_ = 0;
    cur_ = 0;
    mtp_n_ = 0;
    mtp_kv_.k.clear();
    mtp_kv_.v.clear();
    hidden_n_ = 0;
    has_mtp_h_ = false;
    const auto& c = *cfg_;
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto& L = layers_[l];
      L.k.clear();
      L.v.clear();
      if (c.layer_kinds[l] == LayerKind::LinearAttention) {
        L.conv.assign(conv_n_ * size_t(R_), 0.0f);
        L.ssm.assign(ssm_n_ * size_t(R_), 0.0f);
      }
    }
  }
  size_t nbytes() const override {
    size_t n = (mtp_kv_.k.size() + mtp_kv_.v.size() + hidden_.size() + mtp_h_.size()) * sizeof(float);
    for (auto& L : layers_) n += (L.k.size() + L.v.size() + L.conv.size() + L.ssm.size()) * sizeof(float);
    return n;
  }
  int64_t mtp_tokens() const override { return mtp_n_; }
  void truncate_mtp(int64_t n) override {
    if (n < 0 || n > mtp_n_)
      throw InternalError("truncate_mtp(" + std::to_string(n) + ") with " + std::to_string(mtp_n_) + " MTP rows");
    const size_t kvw = size_t(cfg_->n_kv_heads * cfg_->head_dim);
    mtp_n_ = n;
    mtp_kv_.k.resize(size_t(n) * kvw);
    mtp_kv_.v.resize(size_t(n) * kvw);
  }
  int64_t hidden_rows() const override { return hidden_n_; }

  // KV rows of attention layer l, or of the MTP layer (l == cfg.layers).
  Layer& kv(size_t l) { return l == layers_.size() ? mtp_kv_ : layers_[l]; }

  // Version j steps after the current one (the state after tentative row j - 1).
  int ver(int j) const { return (cur_ + j) % R_; }
  float* conv_at(size_t l, int v) { return layers_[l].conv.data() + size_t(v) * conv_n_; }
  float* ssm_at(size_t l, int v) { return layers_[l].ssm.data() + size_t(v) * ssm_n_; }
  const float* conv_at(size_t l, int v) const { return layers_[l].conv.data() + size_t(v) * conv_n_; }
  const float* ssm_at(size_t l, int v) const { return layers_[l].ssm.data() + size_t(v) * ssm_n_; }

  const CpuBackend* owner_;
  const ModelConfig* cfg_;
  int64_t capacity_;
  int64_t n_ = 0, pending_ = 0;
  int R_ = 1, cur_ = 0;
  size_t conv_n_ = 0, ssm_n_ = 0;
  std::vector<Layer> layers_;
  Layer mtp_kv_;                // the MTP layer's KV rows [mtp_n_][Hkv·hd]
  int64_t mtp_n_ = 0;
  std::vector<float> hidden_;   // post-final-norm rows of the latest main step [rows][H] (keep_hidden)
  int64_t hidden_n_ = 0;        // of them valid (a commit keeps its first n)
  std::vector<float> mtp_h_;    // h' of the last row of the latest MTP step [H]
  bool has_mtp_h_ = false;
};

}  // namespace lily::cpu
