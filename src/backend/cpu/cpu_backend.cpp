#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace lily::cpu {

class CpuState final : public SequenceState {
 public:
  struct Layer {
    std::vector<float> k, v;      // attention: [n_tokens][Hkv·hd]
    std::vector<float> conv, ssm; // deltanet: [K-1][C], [Hv][dv][dk]
  };

  CpuState(const ModelConfig& cfg, int64_t capacity) : cfg_(&cfg), capacity_(capacity) {
    layers_.resize(static_cast<size_t>(cfg.layers));
    reset();
  }
  int64_t n_tokens() const override { return n_; }
  int64_t capacity() const override { return capacity_; }
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<CpuState>(*this); }
  void restore(const SequenceState& s) override {
    auto* o = dynamic_cast<const CpuState*>(&s);
    LILY_CHECK(o && o->cfg_ == cfg_, "snapshot belongs to another backend or model");
    *this = *o;
  }
  void reset() override {
    n_ = 0;
    const auto& c = *cfg_;
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto& L = layers_[l];
      L.k.clear();
      L.v.clear();
      if (c.layer_kinds[l] == LayerKind::LinearAttention) {
        L.conv.assign(static_cast<size_t>((c.conv_kernel - 1) * c.conv_channels()), 0.0f);
        L.ssm.assign(static_cast<size_t>(c.lin_v_heads * c.lin_v_dim * c.lin_k_dim), 0.0f);
      }
    }
  }
  size_t nbytes() const override {
    size_t n = 0;
    for (auto& L : layers_) n += (L.k.size() + L.v.size() + L.conv.size() + L.ssm.size()) * sizeof(float);
    return n;
  }

  const ModelConfig* cfg_;
  int64_t capacity_;
  int64_t n_ = 0;
  std::vector<Layer> layers_;
};

CpuBackend::CpuBackend(std::shared_ptr<const ModelWeights> w, CpuOptions opt) : w_(std::move(w)), opt_(opt) {}

std::unique_ptr<SequenceState> CpuBackend::new_state(int64_t max_tokens) {
  LILY_CHECK(max_tokens > 0, "context size must be positive (got {})", max_tokens);
  return std::make_unique<CpuState>(w_->cfg, max_tokens);
}

void CpuBackend::begin(SequenceState& st, int64_t T) {
  st_ = dynamic_cast<CpuState*>(&st);
  LILY_CHECK(st_ && st_->cfg_ == &w_->cfg, "sequence state belongs to another backend or model");
  T_ = T;
  pos0_ = st_->n_;
  const size_t H = size_t(w_->cfg.hidden);
  x_.resize(static_cast<size_t>(T) * H);
  u_.resize(static_cast<size_t>(T) * H);
}

void CpuBackend::embed(const int32_t* tokens) {
  const int64_t H = w_->cfg.hidden;
  for (int64_t t = 0; t < T_; ++t) weight_row(w_->embed, tokens[t], x_.data() + t * H);
}

void CpuBackend::gdn_mixer(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = w_->layers[size_t(layer)];
  const auto& G = L.gdn;
  auto& S = st_->layers_[size_t(layer)];
  const int64_t T = T_, H = cfg.hidden, Hk = cfg.lin_k_heads, Hv = cfg.lin_v_heads, dk = cfg.lin_k_dim,
                dv = cfg.lin_v_dim, C = cfg.conv_channels(), K = cfg.conv_kernel, r = Hv / Hk;
  const float eps = float(cfg.rms_eps);

  rms_norm(x_.data(), L.input_norm.data(), T, H, eps, u_.data());
  a_.resize(static_cast<size_t>(T * C));        // qkv, pre-conv
  b_.resize(static_cast<size_t>(T * C));        // qkv, post conv + silu
  c_.resize(static_cast<size_t>(T * Hv * dv));  // z
  d_.resize(static_cast<size_t>(T * Hv * 2));   // b | a per row
  e_.resize(static_cast<size_t>(T * Hv * dv));  // core output
  mm(G.in_qkv, u_.data(), T, a_.data());
  mm(G.in_z, u_.data(), T, c_.data());
  std::vector<float> bb(static_cast<size_t>(T * Hv)), aa(static_cast<size_t>(T * Hv));
  mm(G.in_b, u_.data(), T, bb.data());
  mm(G.in_a, u_.data(), T, aa.data());

  causal_conv_silu(a_.data(), T, C, K, G.conv.data(), S.conv.data(), b_.data());

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
  const bool recurrent = T <= opt_.recurrent_max_rows;
  ThreadPool::global().parallel_for(Hv, 1, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t h = j / r;  // value head j reads key head ⌊j/r⌋
      DeltaArgs args{b_.data() + h * dk, b_.data() + Hk * dk + h * dk, b_.data() + 2 * Hk * dk + j * dv,
                     beta.data() + j * T, g.data() + j * T, C, C, C, e_.data() + j * dv, Hv * dv,
                     S.ssm.data() + j * dv * dk, T, dk, dv};
      if (recurrent) delta_rule_recurrent(args);
      else delta_rule_chunked(args);
    }
  });
  // Gated RMSNorm per value head: norm(o)·w ⊙ silu(z).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < Hv; ++j) {
      float* o = e_.data() + t * Hv * dv + j * dv;
      const float* z = c_.data() + t * Hv * dv + j * dv;
      float ss = 0;
      for (int64_t d = 0; d < dv; ++d) ss += o[d] * o[d];
      const float inv = 1.0f / std::sqrt(ss / float(dv) + eps);
      for (int64_t d = 0; d < dv; ++d) o[d] = o[d] * inv * G.norm[size_t(d)] * silu(z[d]);
    }
  std::vector<float> out(static_cast<size_t>(T * H));
  mm(G.out, e_.data(), T, out.data());
  for (size_t i = 0; i < out.size(); ++i) x_[i] += out[i];
}

void CpuBackend::attn_mixer(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = w_->layers[size_t(layer)];
  const auto& A = L.attn;
  auto& S = st_->layers_[size_t(layer)];
  const int64_t T = T_, H = cfg.hidden, Hq = cfg.n_heads, Hkv = cfg.n_kv_heads, hd = cfg.head_dim,
                grp = Hq / Hkv, kvw = Hkv * hd;
  const float eps = float(cfg.rms_eps);

  rms_norm(x_.data(), L.input_norm.data(), T, H, eps, u_.data());
  a_.resize(static_cast<size_t>(T * Hq * 2 * hd));
  b_.resize(static_cast<size_t>(T * kvw));
  c_.resize(static_cast<size_t>(T * kvw));
  mm(A.q, u_.data(), T, a_.data());
  mm(A.k, u_.data(), T, b_.data());
  mm(A.v, u_.data(), T, c_.data());

  // q/k RMSNorm per head over hd, then partial RoPE; append k, v to the cache.
  e_.resize(static_cast<size_t>(T * Hq * hd));  // q, then attention output
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = pos0_ + t;
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
  S.k.insert(S.k.end(), b_.begin(), b_.begin() + T * kvw);
  S.v.insert(S.v.end(), c_.begin(), c_.begin() + T * kvw);

  // Causal softmax attention (fp32), GQA: query head h reads KV head ⌊h / grp⌋.
  const float scale = 1.0f / std::sqrt(float(hd));
  d_.resize(static_cast<size_t>(T * Hq * hd));
  ThreadPool::global().parallel_for(T * Hq, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> sc;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, kh = h / grp, n = pos0_ + t + 1;
      const float* q = e_.data() + (t * Hq + h) * hd;
      sc.resize(static_cast<size_t>(n));
      float mx = -INFINITY;
      for (int64_t s = 0; s < n; ++s) {
        sc[size_t(s)] = dot(q, S.k.data() + s * kvw + kh * hd, hd) * scale;
        mx = std::max(mx, sc[size_t(s)]);
      }
      float sum = 0;
      for (auto& v : sc) sum += (v = std::exp(v - mx));
      float* o = d_.data() + (t * Hq + h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t s = 0; s < n; ++s) {
        axpy(sc[size_t(s)] / sum, S.v.data() + s * kvw + kh * hd, o, hd);
      }
      const float* gate = a_.data() + t * Hq * 2 * hd + h * 2 * hd + hd;
      for (int64_t d = 0; d < hd; ++d) o[d] *= sigmoid(gate[d]);
    }
  });
  std::vector<float> out(static_cast<size_t>(T * H));
  mm(A.o, d_.data(), T, out.data());
  for (size_t i = 0; i < out.size(); ++i) x_[i] += out[i];
}

void CpuBackend::expert_mlp(const Expert& e, const float* u, int64_t rows, float* out) {
  const int64_t I = e.gate.out;
  std::vector<float> g(static_cast<size_t>(rows * I)), up(static_cast<size_t>(rows * I));
  mm(e.gate, u, rows, g.data());
  mm(e.up, u, rows, up.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * up[i];
  mm(e.down, g.data(), rows, out);
}

void CpuBackend::ffn(int layer) {
  const auto& cfg = w_->cfg;
  const auto& L = w_->layers[size_t(layer)];
  const auto& F = L.ffn;
  const int64_t T = T_, H = cfg.hidden;
  rms_norm(x_.data(), L.post_norm.data(), T, H, float(cfg.rms_eps), u_.data());
  std::vector<float> out(static_cast<size_t>(T * H));
  if (!F.moe) {
    expert_mlp(F.shared, u_.data(), T, out.data());
    for (size_t i = 0; i < out.size(); ++i) x_[i] += out[i];
    return;
  }
  const int64_t E = cfg.n_experts, k = cfg.top_k;
  std::vector<float> logits(static_cast<size_t>(T * E));
  mm(F.router, u_.data(), T, logits.data());
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
    size_t x, gu, y;  // offsets: rows in xin (routed), rows·I in g / up, rows·H in y
  };
  std::vector<Run> runs;
  size_t nx = 0, ngu = 0, ny = 0;
  auto add = [&](const Expert& ex, int64_t e, int64_t n) {
    runs.push_back({&ex, e, n, nx, ngu, ny});
    if (e >= 0) nx += size_t(n * H);
    ngu += size_t(n * ex.gate.out);
    ny += size_t(n * H);
  };
  for (int64_t e = 0; e < E; ++e)
    if (!assigned[size_t(e)].empty()) add(F.experts[size_t(e)], e, int64_t(assigned[size_t(e)].size()));
  const bool shared = !F.shared.gate.empty();
  if (shared) add(F.shared, -1, T);
  std::vector<float> xin(nx), g(ngu), up(ngu), y(ny), sg(shared ? size_t(T) : 0);
  std::vector<MatJob> jobs;
  for (const Run& r : runs) {
    const float* xr = u_.data();
    if (r.e >= 0) {
      const auto& rows = assigned[size_t(r.e)];
      for (int64_t i = 0; i < r.n; ++i)
        std::memcpy(xin.data() + r.x + size_t(i * H), u_.data() + rows[size_t(i)].first * H, size_t(H) * 4);
      xr = xin.data() + r.x;
    }
    jobs.push_back({&r.ex->gate, xr, r.n, g.data() + r.gu});
    jobs.push_back({&r.ex->up, xr, r.n, up.data() + r.gu});
  }
  if (shared) jobs.push_back({&F.shared_gate, u_.data(), T, sg.data()});
  matmul_batch(jobs, opt_.affine);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * up[i];
  jobs.clear();
  for (const Run& r : runs) jobs.push_back({&r.ex->down, g.data() + r.gu, r.n, y.data() + r.y});
  matmul_batch(jobs, opt_.affine);
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
  for (size_t i = 0; i < out.size(); ++i) x_[i] += out[i];
}

void CpuBackend::head(int64_t rows, float* logits) {
  const auto& cfg = w_->cfg;
  const int64_t H = cfg.hidden;
  std::vector<float> h(static_cast<size_t>(rows * H));
  rms_norm(x_.data() + (T_ - rows) * H, w_->final_norm.data(), rows, H, float(cfg.rms_eps), h.data());
  mm(w_->lm_head, h.data(), rows, logits);
}

void CpuBackend::end() {
  st_->n_ += T_;
  size_t cur = (x_.capacity() + u_.capacity() + a_.capacity() + b_.capacity() + c_.capacity() + d_.capacity() +
                e_.capacity()) * sizeof(float) + st_->nbytes();
  peak_ = std::max(peak_, cur);
  st_ = nullptr;
}

}  // namespace lily::cpu
