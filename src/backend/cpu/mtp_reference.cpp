#include "backend/cpu/mtp_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/qwen_hybrid.h"

namespace lily::cpu {

MtpReference::MtpReference(const ModelWeights& w, AffinePath path) : w_(w), m_(w.require_mtp()), path_(path) {}

void MtpReference::reset() {
  n_ = 0;
  k_.clear();
  v_.clear();
}

void MtpReference::step(std::span<const int32_t> tokens, const float* hidden, float* h_out, float* logits) {
  const auto& c = w_.cfg;
  const int64_t T = int64_t(tokens.size()), H = c.hidden;
  const float eps = float(c.rms_eps);
  if (T == 0) return;
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab) fail("token id {} is outside the vocabulary [0, {})", t, c.vocab);
  // [norm(embed[x]) ‖ norm(h)] per row, then the fc projection to H.
  std::vector<float> cat(static_cast<size_t>(T * 2 * H)), row(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    weight_row(w_.embed, tokens[size_t(t)], row.data());
    rms_norm(row.data(), m_.norm_embed.data(), 1, H, eps, cat.data() + t * 2 * H);
    rms_norm(hidden + t * H, m_.norm_hidden.data(), 1, H, eps, cat.data() + t * 2 * H + H);
  }
  std::vector<float> z(static_cast<size_t>(T * H)), u(static_cast<size_t>(T * H)), d(static_cast<size_t>(T * H));
  mm(m_.fc, cat.data(), T, z.data());
  // One full-attention decoder layer.
  const auto& L = m_.layer;
  rms_norm(z.data(), L.input_norm.data(), T, H, eps, u.data());
  attention(u.data(), T, d.data());
  for (size_t i = 0; i < z.size(); ++i) z[i] += d[i];
  rms_norm(z.data(), L.post_norm.data(), T, H, eps, u.data());
  ffn(u.data(), T, d.data());
  for (size_t i = 0; i < z.size(); ++i) z[i] += d[i];
  rms_norm(z.data(), m_.final_norm.data(), T, H, eps, u.data());
  if (h_out) std::copy(u.begin(), u.end(), h_out);
  if (logits) mm(w_.lm_head, u.data(), T, logits);
  n_ += T;
}

// Gated attention (model doc §3.3): per-head interleaved query | gate rows, q/k RMSNorm over the head
// dimension, partial RoPE at positions n_ + t, causal softmax over the cache, output ⊙ sigmoid(gate).
void MtpReference::attention(const float* u, int64_t T, float* out) {
  const auto& c = w_.cfg;
  const auto& A = m_.layer.attn;
  const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim, grp = Hq / Hkv, kvw = Hkv * hd;
  const float eps = float(c.rms_eps);
  std::vector<float> qg(static_cast<size_t>(T * Hq * 2 * hd)), k(static_cast<size_t>(T * kvw)), v(static_cast<size_t>(T * kvw));
  mm(A.q, u, T, qg.data());
  mm(A.k, u, T, k.data());
  mm(A.v, u, T, v.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hkv; ++h) {
      float* kh = k.data() + t * kvw + h * hd;
      rms_norm(kh, A.k_norm.data(), 1, hd, eps, kh);
      rope(kh, c.rotary_dim, w_.rope_inv_freq.data(), n_ + t);
    }
  k_.insert(k_.end(), k.begin(), k.end());
  v_.insert(v_.end(), v.begin(), v.end());
  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> o(static_cast<size_t>(T * Hq * hd)), q(static_cast<size_t>(hd)), p;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = n_ + t + 1;  // keys visible to row t
    for (int64_t h = 0; h < Hq; ++h) {
      const float* qh = qg.data() + t * Hq * 2 * hd + h * 2 * hd;
      rms_norm(qh, A.q_norm.data(), 1, hd, eps, q.data());
      rope(q.data(), c.rotary_dim, w_.rope_inv_freq.data(), n_ + t);
      p.assign(size_t(n), 0.0f);
      float mx = -INFINITY;
      for (int64_t s = 0; s < n; ++s) {
        const float* ks = k_.data() + s * kvw + (h / grp) * hd;
        float acc = 0;
        for (int64_t i = 0; i < hd; ++i) acc += q[size_t(i)] * ks[i];
        p[size_t(s)] = acc * scale;
        mx = std::max(mx, p[size_t(s)]);
      }
      float sum = 0;
      for (auto& x : p) sum += (x = std::exp(x - mx));
      float* oh = o.data() + (t * Hq + h) * hd;
      for (int64_t s = 0; s < n; ++s) {
        const float* vs = v_.data() + s * kvw + (h / grp) * hd;
        for (int64_t i = 0; i < hd; ++i) oh[i] += p[size_t(s)] / sum * vs[i];
      }
      for (int64_t i = 0; i < hd; ++i) oh[i] *= sigmoid(qh[hd + i]);
    }
  }
  mm(A.o, o.data(), T, out);
}

// MoE (model doc §3.5): softmax over all experts, top-k (ties: lower index), renormalised when
// norm_topk_prob, plus the sigmoid-gated shared expert; or the dense MLP. Row by row.
void MtpReference::ffn(const float* u, int64_t T, float* out) {
  const auto& c = w_.cfg;
  const auto& F = m_.layer.ffn;
  const int64_t H = c.hidden;
  auto mlp = [&](const Expert& e, const float* x, float* y) {
    const int64_t I = e.gate.out;
    std::vector<float> g(static_cast<size_t>(I)), up(static_cast<size_t>(I));
    mm(e.gate, x, 1, g.data());
    mm(e.up, x, 1, up.data());
    for (int64_t i = 0; i < I; ++i) g[size_t(i)] = silu(g[size_t(i)]) * up[size_t(i)];
    mm(e.down, g.data(), 1, y);
  };
  std::fill(out, out + T * H, 0.0f);
  std::vector<float> y(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = u + t * H;
    float* o = out + t * H;
    if (!F.moe) {
      mlp(F.shared, x, o);
      continue;
    }
    const int64_t E = c.n_experts, K = c.top_k;
    std::vector<float> p(static_cast<size_t>(E));
    mm(F.router, x, 1, p.data());
    const float mx = *std::max_element(p.begin(), p.end());
    float sum = 0;
    for (auto& v : p) sum += (v = std::exp(v - mx));
    for (auto& v : p) v /= sum;
    std::vector<int64_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    float ks = 0;
    for (int64_t i = 0; i < K; ++i) ks += p[size_t(idx[size_t(i)])];
    for (int64_t i = 0; i < K; ++i) {
      const int64_t e = idx[size_t(i)];
      const float wgt = c.norm_topk ? p[size_t(e)] / ks : p[size_t(e)];
      mlp(F.experts[size_t(e)], x, y.data());
      for (int64_t j = 0; j < H; ++j) o[j] += wgt * y[size_t(j)];
    }
    if (!F.shared.gate.empty()) {
      float g = 0;
      mm(F.shared_gate, x, 1, &g);
      mlp(F.shared, x, y.data());
      for (int64_t j = 0; j < H; ++j) o[j] += sigmoid(g) * y[size_t(j)];
    }
  }
}

std::vector<float> mtp_teacher_forced(const ModelWeights& w, std::span<const int32_t> tokens, const float* hidden,
                                      AffinePath path) {
  LILY_CHECK(tokens.size() >= 2, "MTP logits need at least 2 tokens (got {})", tokens.size());
  MtpReference mtp(w, path);
  const size_t T = tokens.size() - 1;
  std::vector<float> logits(T * size_t(w.cfg.vocab));
  mtp.step(tokens.subspan(1), hidden, nullptr, logits.data());
  return logits;
}

std::vector<int32_t> mtp_greedy_draft(const ModelWeights& w, std::span<const int32_t> tokens, const float* hidden,
                                      int64_t depth, AffinePath path) {
  LILY_CHECK(tokens.size() >= 2, "an MTP draft needs at least 2 tokens (got {})", tokens.size());
  LILY_CHECK(depth >= 1, "MTP draft depth must be at least 1 (got {})", depth);
  const int64_t T = int64_t(tokens.size()) - 1, H = w.cfg.hidden, V = w.cfg.vocab;
  MtpReference mtp(w, path);
  std::vector<float> h(static_cast<size_t>(T * H)), logits(static_cast<size_t>(T * V));
  mtp.step(tokens.subspan(1), hidden, h.data(), logits.data());
  std::vector<int32_t> draft;
  std::vector<float> last(h.end() - H, h.end());
  const float* lg = logits.data() + (T - 1) * V;
  for (int64_t d = 0; d < depth; ++d) {
    const int32_t tok = int32_t(std::max_element(lg, lg + V) - lg);
    draft.push_back(tok);
    if (d + 1 == depth) break;
    std::vector<float> next(static_cast<size_t>(H));
    logits.resize(size_t(V));
    mtp.step(std::span<const int32_t>(&tok, 1), last.data(), next.data(), logits.data());
    last = std::move(next);
    lg = logits.data();
  }
  return draft;
}

std::vector<float> final_hidden_states(CpuBackend& be, SequenceState& st, std::span<const int32_t> tokens,
                                       int64_t chunk, float* logits) {
  const auto& w = be.weights();
  const int64_t T = int64_t(tokens.size()), H = w.cfg.hidden, V = w.cfg.vocab;
  if (chunk <= 0) chunk = be.preferred_prefill_chunk();
  std::vector<float> h(static_cast<size_t>(T * H));
  for (int64_t b = 0; b < T; b += chunk) {
    const int64_t m = std::min(chunk, T - b);
    forward_step(be, st, tokens.subspan(size_t(b), size_t(m)), logits ? m : 0, logits ? logits + b * V : nullptr);
    const auto& x = be.residual();
    LILY_ASSERT(int64_t(x.size()) >= m * H);
    rms_norm(x.data(), w.final_norm.data(), m, H, float(w.cfg.rms_eps), h.data() + b * H);
  }
  return h;
}

}  // namespace lily::cpu
