#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_state.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/operand_emulation.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "backend/product_class.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/load_linear.h"

namespace lily::cpu {


CpuBackend::CpuBackend(std::shared_ptr<const ModelWeights> w, CpuOptions opt) : w_(std::move(w)), opt_(opt) {}

bool CpuBackend::reduced(uint32_t cls, int64_t rows, Operand& op) const {
  if (rows < opt_.emulate_bf16_rows) return false;
  if (opt_.emulate_fp16 & cls) op = Operand::kFp16;
  else if (opt_.emulate_bf16 & cls) op = Operand::kBf16;
  else if (opt_.emulate_split) op = Operand::kSplit;
  else return false;
  return true;
}

void CpuBackend::mm(const Linear& W, const float* x, int64_t T, float* y, uint32_t cls, int64_t rows) const {
  Operand op;
  if (reduced(cls, rows, op) && !(op == Operand::kSplit && W.format == WeightFormat::Exl3))
    matmul_reduced_operands(op, W, x, T, y, opt_.emulate_k_order);
  else matmul(W, x, T, y, opt_.affine);
}

void CpuBackend::mm_batch(const std::vector<MatJob>& jobs, const std::vector<uint32_t>& cls) const {
  std::vector<MatJob> plain;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Operand op;
    if (reduced(cls[i], T_, op) && !(op == Operand::kSplit && jobs[i].W->format == WeightFormat::Exl3))
      matmul_reduced_operands(op, *jobs[i].W, jobs[i].x, jobs[i].T, jobs[i].y, opt_.emulate_k_order);
    else plain.push_back(jobs[i]);
  }
  matmul_batch(plain, opt_.affine);
}

std::unique_ptr<SequenceState> CpuBackend::new_state(int64_t max_tokens) {
  LILY_CHECK(max_tokens > 0, "context size must be positive (got {})", max_tokens);
  return std::make_unique<CpuState>(*this, w_->cfg, max_tokens);
}

void CpuBackend::begin(const Step& step) {
  step.validate(w_->cfg.vocab);
  if (step.mtp) w_->require_mtp();
  mtp_ = step.mtp;
  head_vocab_ = step.mtp ? step.head_vocab : 0;
  tokens_ = step.tokens;
  hidden_src_ = step.hidden;
  groups_.clear();
  pos_.resize(tokens_.size());
  for (const StepGroup& g : step.groups) {
    auto* st = dynamic_cast<CpuState*>(g.seq);
    if (!st || st->owner_ != this) throw InternalError("a step group's sequence state belongs to another backend");
    if (g.sample) throw InternalError("the CPU backend has no device sampler (a step group asks for drawn ids)");
    if (tokens_[size_t(g.first)] == kFedToken) throw InternalError("the CPU backend has no device sampler to feed a row from");
    if (mtp_ && hidden_src_[size_t(g.first)] == kMtpHidden && !st->has_mtp_h_)
      throw InternalError("an MTP row reads the previous MTP step's h', but its sequence ran no MTP step since its last reset");
    const int64_t pos0 = mtp_ ? st->mtp_n_ : st->n_;
    groups_.push_back({st, g.first, g.rows, pos0, g.out_rows, g.logits, g.tentative, g.keep_hidden});
    for (int64_t r = 0; r < g.rows; ++r) pos_[size_t(g.first + r)] = pos0 + r;
  }
  T_ = int64_t(tokens_.size());
  const size_t H = size_t(w_->cfg.hidden);
  x_.resize(static_cast<size_t>(T_) * H);
  u_.resize(static_cast<size_t>(T_) * H);
}

void CpuBackend::embed() {
  const int64_t H = w_->cfg.hidden;
  if (!mtp_) {
    for (int64_t t = 0; t < T_; ++t) weight_row(w_->embed, tokens_[size_t(t)], x_.data() + t * H);
    return;
  }
  // MTP: x = fc([norm_e(embed[token]) ‖ norm_h(hidden)]) per row.
  const MtpWeights& m = *w_->mtp;
  const float eps = float(w_->cfg.rms_eps);
  std::vector<float> cat(static_cast<size_t>(T_ * 2 * H));
  for (const Group& g : groups_)
    for (int64_t r = g.first; r < g.first + g.rows; ++r) {
      float* c = cat.data() + r * 2 * H;
      weight_row(w_->embed, tokens_[size_t(r)], u_.data());
      rms_norm(u_.data(), m.norm_embed.data(), 1, H, eps, c);
      const int32_t src = hidden_src_[size_t(r)];
      const float* h = src == kMtpHidden ? g.st->mtp_h_.data() : g.st->hidden_.data() + src * H;
      rms_norm(h, m.norm_hidden.data(), 1, H, eps, c + H);
    }
  mm(m.fc, cat.data(), T_, x_.data(), kProdMtpFc, T_);
}

const LayerWeights& CpuBackend::layer_weights(int layer) const {
  return layer == int(w_->cfg.layers) ? w_->mtp->layer : w_->layers[size_t(layer)];
}

void CpuBackend::gdn_mixer(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = w_->layers[size_t(layer)];
  const auto& G = L.gdn;
  const int64_t T = T_, H = cfg.hidden, Hk = cfg.lin_k_heads, Hv = cfg.lin_v_heads, dk = cfg.lin_k_dim,
                dv = cfg.lin_v_dim, C = cfg.conv_channels(), K = cfg.conv_kernel, r = Hv / Hk;
  const float eps = float(cfg.rms_eps);

  rms_norm(x_.data(), L.input_norm.data(), T, H, eps, u_.data());
  a_.resize(static_cast<size_t>(T * C));        // qkv, pre-conv
  b_.resize(static_cast<size_t>(T * C));        // qkv, post conv + silu
  c_.resize(static_cast<size_t>(T * Hv * dv));  // z
  d_.resize(static_cast<size_t>(T * Hv * 2));   // b | a per row
  e_.resize(static_cast<size_t>(T * Hv * dv));  // core output
  std::vector<float> bb(static_cast<size_t>(T * Hv)), aa(static_cast<size_t>(T * Hv));
  // one batch: the input quantised once, one hand-off to the threads (decode runs hundreds of products a token)
  mm_batch({{&G.in_qkv, u_.data(), T, a_.data()}, {&G.in_z, u_.data(), T, c_.data()}, {&G.in_b, u_.data(), T, bb.data()},
            {&G.in_a, u_.data(), T, aa.data()}},
           std::vector<uint32_t>(4, kProdGdnIn));

  // Conv per group over its sequence's carried rows; a tentative group keeps the state after every row
  // (version j + 1 after row j, the current version untouched).
  const size_t l = size_t(layer);
  for (const Group& gr : groups_) {
    const float* xin = a_.data() + gr.first * C;
    float* yout = b_.data() + gr.first * C;
    if (!gr.tentative) {
      causal_conv_silu(xin, gr.rows, C, K, G.conv.data(), gr.st->conv_at(l, gr.st->ver(0)), yout);
      continue;
    }
    for (int64_t j = 0; j < gr.rows; ++j) {
      float* dst = gr.st->conv_at(l, gr.st->ver(int(j) + 1));
      std::copy_n(gr.st->conv_at(l, gr.st->ver(int(j))), size_t((K - 1) * C), dst);
      causal_conv_silu(xin + j * C, 1, C, K, G.conv.data(), dst, yout + j * C);
    }
  }

  // L2-normalise q and k per head (eps on the sum of squares), scale q by 1/sqrt(dk).
  const float qscale = 1.0f / std::sqrt(float(dk));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < 2 * Hk; ++h) {
      float* p = b_.data() + t * C + h * dk;
      float ss = 0;
      for (int64_t i = 0; i < dk; ++i) ss += p[i] * p[i];
      float inv = 1.0f / std::sqrt(ss + 1e-6f);
      if (h < Hk) inv *= qscale;
      for (int64_t i = 0; i < dk; ++i) p[i] *= inv;
    }
  // β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias); stored per head as [Hv][T].
  std::vector<float> beta(static_cast<size_t>(Hv * T)), g(static_cast<size_t>(Hv * T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < Hv; ++j) {
      beta[size_t(j * T + t)] = sigmoid(bb[size_t(t * Hv + j)]);
      g[size_t(j * T + t)] = G.A_neg[size_t(j)] * softplus(aa[size_t(t * Hv + j)] + G.dt_bias[size_t(j)]);
    }
  // The delta rule per (group, value head) over the group's rows and its sequence's state; the recurrent
  // form for short groups (and every tentative one, which checkpoints the state after each row).
  const int64_t G_n = int64_t(groups_.size());
  ThreadPool::global().parallel_for(G_n * Hv, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Group& gr = groups_[size_t(i / Hv)];
      const int64_t j = i % Hv, h = j / r;  // value head j reads key head ⌊j/r⌋
      const int64_t t0 = gr.first;
      DeltaArgs args{b_.data() + t0 * C + h * dk, b_.data() + t0 * C + Hk * dk + h * dk,
                     b_.data() + t0 * C + 2 * Hk * dk + j * dv, beta.data() + j * T + t0, g.data() + j * T + t0,
                     C, C, C, e_.data() + t0 * Hv * dv + j * dv, Hv * dv,
                     gr.st->ssm_at(l, gr.st->ver(0)) + j * dv * dk, gr.rows, dk, dv};
      if (gr.tentative) {
        for (int64_t row = 0; row < gr.rows; ++row) {
          DeltaArgs a1 = args;
          a1.q += row * C; a1.k += row * C; a1.v += row * C; a1.beta += row; a1.g += row; a1.o += row * Hv * dv;
          a1.T = 1;
          a1.S = gr.st->ssm_at(l, gr.st->ver(int(row) + 1)) + j * dv * dk;
          std::copy_n(gr.st->ssm_at(l, gr.st->ver(int(row))) + j * dv * dk, size_t(dv * dk), a1.S);
          delta_rule_recurrent(a1);
        }
      } else if (gr.rows <= opt_.recurrent_max_rows) {
        delta_rule_recurrent(args);
      } else {
        delta_rule_chunked(args);
      }
    }
  });
  // Gated RMSNorm per value head: norm(o)·w ⊙ silu(z).
  gated_rms_norm(e_.data(), c_.data(), G.norm.data(), T * Hv, dv, eps);
  std::vector<float> out(static_cast<size_t>(T * H));
  mm(G.out, e_.data(), T, out.data(), kProdGdnOut, T);
  emit(out);
}

void CpuBackend::attn_mixer(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = layer_weights(layer);
  const auto& A = L.attn;
  const int64_t T = T_, H = cfg.hidden, Hq = cfg.n_heads, Hkv = cfg.n_kv_heads, hd = cfg.head_dim,
                kvw = Hkv * hd;
  const float eps = float(cfg.rms_eps);

  rms_norm(x_.data(), L.input_norm.data(), T, H, eps, u_.data());
  a_.resize(static_cast<size_t>(T * Hq * 2 * hd));
  b_.resize(static_cast<size_t>(T * kvw));
  c_.resize(static_cast<size_t>(T * kvw));
  mm_batch({{&A.q, u_.data(), T, a_.data()}, {&A.k, u_.data(), T, b_.data()}, {&A.v, u_.data(), T, c_.data()}},
           std::vector<uint32_t>(3, kProdAttnIn));

  // q/k RMSNorm per head over hd, then partial RoPE; append k, v to the cache.
  e_.resize(static_cast<size_t>(T * Hq * hd));  // q, then attention output
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = pos_[size_t(t)];
    for (int64_t h = 0; h < Hq; ++h) {
      float* q = e_.data() + (t * Hq + h) * hd;
      rms_norm(a_.data() + t * Hq * 2 * hd + h * 2 * hd, A.q_norm.data(), 1, hd, eps, q);
      rope(q, cfg.rotary_dim, w_->rope_inv_freq.data(), pos);
    }
    for (int64_t h = 0; h < Hkv; ++h) {
      float* k = b_.data() + t * kvw + h * hd;
      rms_norm(k, A.k_norm.data(), 1, hd, eps, k);
      rope(k, cfg.rotary_dim, w_->rope_inv_freq.data(), pos);
    }
  }
  if (opt_.emulate_bf16_kv)
    for (size_t i = 0; i < size_t(T * kvw); ++i) {
      b_[i] = round_bf16(b_[i]);
      c_[i] = round_bf16(c_[i]);
    }
  std::vector<AttnSeq> seqs;
  for (const Group& gr : groups_) {
    auto& S = gr.st->kv(size_t(layer));
    S.k.insert(S.k.end(), b_.begin() + gr.first * kvw, b_.begin() + (gr.first + gr.rows) * kvw);
    S.v.insert(S.v.end(), c_.begin() + gr.first * kvw, c_.begin() + (gr.first + gr.rows) * kvw);
  }
  for (const Group& gr : groups_) {  // after every append: a sequence's vectors no longer move
    const auto& S = gr.st->kv(size_t(layer));
    seqs.push_back({S.k.data(), S.v.data(), gr.first, gr.rows, gr.pos0});
  }
  d_.resize(static_cast<size_t>(T * Hq * hd));
  AttnArgs args{e_.data(), a_.data() + hd, Hq * 2 * hd, 2 * hd, d_.data(), Hq, Hkv, hd, 1.0f / std::sqrt(float(hd))};
  attention(args, seqs);
  std::vector<float> out(static_cast<size_t>(T * H));
  mm(A.o, d_.data(), T, out.data(), kProdAttnOut, T);
  emit(out);
}

void CpuBackend::emit(std::vector<float>& out) {
  if (rank_mode_) {
    partial_ = std::move(out);
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) x_[i] += out[i];
}

void CpuBackend::add_partial() {
  if (partial_.size() != x_.size()) throw InternalError("CpuBackend::add_partial: no partial of this step");
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += partial_[i];
}

void CpuBackend::expert_mlp(const Expert& e, const float* u, int64_t rows, float* out, uint32_t cls) {
  const int64_t I = e.gate.out;
  std::vector<float> g(static_cast<size_t>(rows * I)), up(static_cast<size_t>(rows * I));
  mm(e.gate, u, rows, g.data(), cls, T_);
  mm(e.up, u, rows, up.data(), cls, T_);
  swiglu(g.data(), up.data(), int64_t(g.size()));
  mm(e.down, g.data(), rows, out, cls, T_);
}

void CpuBackend::ffn(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = layer_weights(layer);
  const auto& F = L.ffn;
  const int64_t T = T_, H = cfg.hidden;
  rms_norm(x_.data(), L.post_norm.data(), T, H, float(cfg.rms_eps), u_.data());
  std::vector<float> out(static_cast<size_t>(T * H));
  if (!F.moe) {
    if (!F.shared.gate.empty()) expert_mlp(F.shared, u_.data(), T, out.data(), kProdMlp);  // empty: another rank's
    emit(out);
    return;
  }
  const int64_t E = cfg.n_experts, k = cfg.top_k;
  std::vector<float> logits(static_cast<size_t>(T * E));
  mm(F.router, u_.data(), T, logits.data(), kProdRouter, T);
  // Softmax over all experts (fp32), top-k by probability (ties: lower index), renormalise.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(E));  // expert -> (row, weight)
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = logits.data() + t * E;
    const float mx = *std::max_element(lg, lg + E);
    std::vector<float> p(static_cast<size_t>(E));
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(lg[e] - mx));
    for (auto& v : p) v /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float ks = 0;
    for (int64_t i = 0; i < k; ++i) ks += p[size_t(idx[size_t(i)])];
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = idx[size_t(i)];
      assigned[size_t(e)].push_back({t, cfg.norm_topk ? p[size_t(e)] / ks : p[size_t(e)]});
    }
  }
  // Each routed expert runs once over the rows routed to it, the shared expert over all rows. Their
  // products go in two batched passes (gate and up of every expert, then every down): one hand-off to
  // the threads each instead of three per expert, each distinct input quantised once.
  struct Run {
    const Expert* ex;
    int64_t e, n;     // expert (-1: shared), rows
    size_t x, gu, y;  // offsets: rows in xin (routed, fewer than T rows), rows·I in g / up, rows·H in y
  };
  std::vector<Run> runs;
  size_t nx = 0, ngu = 0, ny = 0;
  auto add = [&](const Expert& ex, int64_t e, int64_t n) {
    runs.push_back({&ex, e, n, nx, ngu, ny});
    if (e >= 0 && n < T) nx += size_t(n * H);
    ngu += size_t(n * ex.gate.out);
    ny += size_t(n * H);
  };
  const int64_t e0 = F.expert0, e1 = e0 + int64_t(F.experts.size());  // this rank's experts (all, unsplit)
  for (int64_t e = e0; e < e1; ++e)
    if (!assigned[size_t(e)].empty()) add(F.experts[size_t(e - e0)], e, int64_t(assigned[size_t(e)].size()));
  const bool shared = !F.shared.gate.empty();
  if (shared) add(F.shared, -1, T);
  std::vector<float> xin(nx), g(ngu), up(ngu), y(ny), sg(shared ? size_t(T) : 0);
  std::vector<MatJob> jobs;
  std::vector<uint32_t> cls;  // each job's product class
  for (const Run& r : runs) {
    // an expert that every row routes to reads u_ itself (rows are added in order): one input, quantised once
    const float* xr = u_.data();
    if (r.e >= 0 && r.n < T) {
      const auto& rows = assigned[size_t(r.e)];
      for (int64_t i = 0; i < r.n; ++i)
        std::memcpy(xin.data() + r.x + size_t(i * H), u_.data() + rows[size_t(i)].first * H, size_t(H) * 4);
      xr = xin.data() + r.x;
    }
    jobs.push_back({&r.ex->gate, xr, r.n, g.data() + r.gu});
    jobs.push_back({&r.ex->up, xr, r.n, up.data() + r.gu});
    cls.insert(cls.end(), 2, r.e >= 0 ? kProdExpertsGateUp : kProdShared);
  }
  if (shared) {
    jobs.push_back({&F.shared_gate, u_.data(), T, sg.data()});
    cls.push_back(kProdRouter);
  }
  mm_batch(jobs, cls);
  swiglu(g.data(), up.data(), int64_t(g.size()));
  jobs.clear();
  cls.clear();
  for (const Run& r : runs) {
    jobs.push_back({&r.ex->down, g.data() + r.gu, r.n, y.data() + r.y});
    cls.push_back(r.e >= 0 ? kProdExpertsDown : kProdShared);
  }
  mm_batch(jobs, cls);
  for (const Run& r : runs) {
    const float* yr = y.data() + r.y;
    if (r.e >= 0) {
      const auto& rows = assigned[size_t(r.e)];
      for (int64_t i = 0; i < r.n; ++i) {
        float* o = out.data() + rows[size_t(i)].first * H;
        const float w = rows[size_t(i)].second;
        for (int64_t h = 0; h < H; ++h) o[h] += w * yr[i * H + h];
      }
    } else {
      for (int64_t t = 0; t < T; ++t) {
        const float gt = sigmoid(sg[size_t(t)]);
        for (int64_t h = 0; h < H; ++h) out[size_t(t * H + h)] += gt * yr[t * H + h];
      }
    }
  }
  emit(out);
}

void CpuBackend::head() {
  const auto& cfg = w_->cfg;
  const int64_t H = cfg.hidden;
  const float eps = float(cfg.rms_eps);
  const float* norm = mtp_ ? w_->mtp->final_norm.data() : w_->final_norm.data();
  int64_t rows = 0;
  for (const Group& g : groups_)
    if (g.logits) rows += g.out_rows;
  std::vector<float> h(static_cast<size_t>(rows * H));
  int64_t r = 0;
  for (const Group& g : groups_) {
    const float* x = x_.data() + g.first * H;
    if (mtp_) {  // h' of the group's last row: the hidden input of the sequence's next chain row
      g.st->mtp_h_.resize(size_t(H));
      rms_norm(x + (g.rows - 1) * H, norm, 1, H, eps, g.st->mtp_h_.data());
      g.st->has_mtp_h_ = true;
    } else if (g.keep_hidden) {
      g.st->hidden_.resize(size_t(g.rows * H));
      rms_norm(x, norm, g.rows, H, eps, g.st->hidden_.data());
      g.st->hidden_n_ = g.rows;
    } else {
      g.st->hidden_n_ = 0;
    }
    if (!g.logits || g.out_rows == 0) continue;
    rms_norm(x + (g.rows - g.out_rows) * H, norm, g.out_rows, H, eps, h.data() + r * H);
    r += g.out_rows;
  }
  out_.swap(spare_);
  out_.assign(static_cast<size_t>(rows * cfg.vocab), 0.0f);
  if (rows == 0) return;
  const int64_t Vr = w_->lm_head.out, v0 = w_->vocab0;  // a rank's vocabulary rows (all, unsplit)
  // an MTP step's draft head over ids [0, head_vocab): the rows past it are -inf
  if (head_vocab_ > 0 && head_vocab_ < cfg.vocab && Vr == cfg.vocab) {
    auto it = head_prefix_.find(head_vocab_);
    if (it == head_prefix_.end()) it = head_prefix_.emplace(head_vocab_, row_prefix(w_->lm_head, head_vocab_)).first;
    if (!it->second.empty()) {
      const int64_t n = head_vocab_;
      std::vector<float> part(static_cast<size_t>(rows * n));
      mm(it->second, h.data(), rows, part.data(), kProdLmHead, rows);
      for (int64_t i = 0; i < rows; ++i) {
        float* o = out_.data() + i * cfg.vocab;
        std::copy_n(part.data() + i * n, n, o);
        std::fill(o + n, o + cfg.vocab, -std::numeric_limits<float>::infinity());
      }
      return;
    }
  }
  if (Vr == cfg.vocab) {
    mm(w_->lm_head, h.data(), rows, out_.data(), kProdLmHead, rows);
    return;
  }
  std::vector<float> part(static_cast<size_t>(rows * Vr));
  mm(w_->lm_head, h.data(), rows, part.data(), kProdLmHead, rows);
  for (int64_t i = 0; i < rows; ++i) std::copy_n(part.data() + i * Vr, Vr, out_.data() + i * cfg.vocab + v0);
}

uint64_t CpuBackend::end() {
  size_t states = 0;
  for (const Group& g : groups_) {
    if (mtp_) g.st->mtp_n_ += g.rows;
    else if (g.tentative) g.st->pending_ = g.rows;
    else g.st->n_ += g.rows;
    states += g.st->nbytes();
  }
  size_t cur = (x_.capacity() + u_.capacity() + a_.capacity() + b_.capacity() + c_.capacity() + d_.capacity() +
                e_.capacity() + out_.capacity() + spare_.capacity()) * sizeof(float) + states;
  peak_ = std::max(peak_, cur);
  groups_.clear();
  const uint64_t t = next_ticket_++;
  done_.emplace_back(t, std::move(out_));
  out_ = {};
  return t;
}

void CpuBackend::finish(uint64_t ticket, const StepOutputs& out) {
  if (done_.empty() || done_.front().first != ticket)
    throw InternalError("CpuBackend::finish: ticket " + std::to_string(ticket) + " is not the oldest unfinished step");
  const std::vector<float>& l = done_.front().second;
  if (out.logits) std::copy(l.begin(), l.end(), out.logits);
  if (l.capacity() <= size_t(8 * w_->cfg.vocab)) spare_ = std::move(done_.front().second);  // decode-sized only
  done_.pop_front();
}

}  // namespace lily::cpu
