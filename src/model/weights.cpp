#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "model/load_linear.h"

namespace lily {

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::Affine: return "affine";
    case WeightFormat::Exl3: return "exl3";
  }
  return "?";
}

namespace {

float read_float(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: { float v; std::memcpy(&v, t.data + 4 * i, 4); return v; }
    case DType::BF16: { uint16_t v; std::memcpy(&v, t.data + 2 * i, 2); return bf16_to_f32(v); }
    case DType::F16: { uint16_t v; std::memcpy(&v, t.data + 2 * i, 2); return f16_to_f32(v); }
    case DType::F64: { double v; std::memcpy(&v, t.data + 8 * i, 8); return float(v); }
    default: fail("{}: tensor '{}' has dtype {}, expected a float type", t.file, t.name, dtype_name(t.dtype));
  }
}

void check_shape(const TensorInfo& t, std::vector<int64_t> want) {
  if (t.shape != want) {
    TensorInfo w;
    w.shape = want;
    fail("{}: tensor '{}' has shape {}, expected {}", t.file, t.name, t.shape_str(), w.shape_str());
  }
}

class Loader {
 public:
  Loader(const ModelConfig& cfg, const Checkpoint& ck, ModelWeights& w, bool norms_shifted)
      : cfg_(cfg), ck_(ck), w_(w), norms_shifted_(norms_shifted) {}

  std::vector<float> vec(const std::string& name, int64_t n, bool plus_one) {
    const auto& t = ck_.get(name);
    if (t.numel() != n || t.shape.size() != 1) check_shape(t, {n});
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = read_float(t, i) + (plus_one ? 1.0f : 0.0f);
    return v;
  }

  Linear linear(const std::string& base, int64_t out, int64_t in) {
    return load_linear(ck_, cfg_, base, out, in, w_.owned);
  }

  // Experts: per-expert tensors, HF fused gate_up_proj / down_proj, or a format-specific stack.
  std::vector<Expert> experts(const std::string& p) {
    const int64_t E = cfg_.n_experts, I = cfg_.moe_inter, H = cfg_.hidden;
    std::vector<Expert> ex(static_cast<size_t>(E));
    if (auto* gu = ck_.find(p + "experts.gate_up_proj")) {
      const auto& dn = ck_.get(p + "experts.down_proj");
      check_shape(*gu, {E, 2 * I, H});
      check_shape(dn, {E, H, I});
      for (const auto* t : {gu, &dn})
        if (!dtype_is_float(t->dtype)) fail("{}: tensor '{}' has dtype {}, expected a float type", t->file, t->name, dtype_name(t->dtype));
      size_t es = dtype_size(gu->dtype);
      for (int64_t e = 0; e < E; ++e) {
        const uint8_t* g = gu->data + size_t(e * 2 * I * H) * es;
        ex[size_t(e)].gate = dense_view(gu->name, gu->dtype, g, I, H);
        ex[size_t(e)].up = dense_view(gu->name, gu->dtype, g + size_t(I * H) * es, I, H);
        ex[size_t(e)].down = dense_view(dn.name, dn.dtype, dn.data + size_t(e * H * I) * dtype_size(dn.dtype), H, I);
      }
      return ex;
    }
    if (load_stacked_experts(ck_, cfg_, p, ex, w_.owned)) return ex;
    for (int64_t e = 0; e < E; ++e) {
      std::string b = p + "experts." + std::to_string(e) + ".";
      ex[size_t(e)].gate = linear(b + "gate_proj", I, H);
      ex[size_t(e)].up = linear(b + "up_proj", I, H);
      ex[size_t(e)].down = linear(b + "down_proj", H, I);
    }
    return ex;
  }

  static Linear dense_view(const std::string& name, DType dt, const uint8_t* data, int64_t out, int64_t in) {
    Linear l;
    l.name = name;
    l.out = out;
    l.in = in;
    l.format = WeightFormat::Dense;
    l.dense = {dt, data, in};
    return l;
  }

  void gdn(const std::string& p, GdnWeights& g) {
    const int64_t H = cfg_.hidden, Hk = cfg_.lin_k_heads, Hv = cfg_.lin_v_heads, dk = cfg_.lin_k_dim,
                  dv = cfg_.lin_v_dim, K = cfg_.conv_kernel, C = cfg_.conv_channels();
    if (cfg_.arch == Arch::Qwen3Next) {
      Linear qkvz = linear(p + "in_proj_qkvz", 2 * Hk * dk + 2 * Hv * dv, H);
      Linear ba = linear(p + "in_proj_ba", 2 * Hv, H);
      // Per key head g: [q(dk) | k(dk) | v(r·dv) | z(r·dv)] and [b(r) | a(r)]; see model doc §2.5.
      const int64_t r = Hv / Hk, B = 2 * dk + 2 * r * dv;
      std::vector<int64_t> qkv_rows, z_rows, b_rows, a_rows;
      for (int64_t g = 0; g < Hk; ++g)
        for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(g * B + d);
      for (int64_t g = 0; g < Hk; ++g)
        for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(g * B + dk + d);
      for (int64_t j = 0; j < Hv; ++j) {
        int64_t g = j / r, i = j % r;
        for (int64_t d = 0; d < dv; ++d) {
          qkv_rows.push_back(g * B + 2 * dk + i * dv + d);
          z_rows.push_back(g * B + 2 * dk + r * dv + i * dv + d);
        }
        b_rows.push_back(g * 2 * r + i);
        a_rows.push_back(g * 2 * r + r + i);
      }
      g.in_qkv = select_rows(qkvz, qkv_rows, w_.owned);
      g.in_z = select_rows(qkvz, z_rows, w_.owned);
      g.in_b = select_rows(ba, b_rows, w_.owned);
      g.in_a = select_rows(ba, a_rows, w_.owned);
    } else {
      g.in_qkv = linear(p + "in_proj_qkv", C, H);
      g.in_z = linear(p + "in_proj_z", Hv * dv, H);
      g.in_b = linear(p + "in_proj_b", Hv, H);
      g.in_a = linear(p + "in_proj_a", Hv, H);
    }
    const auto& cw = ck_.get(p + "conv1d.weight");
    // HF stores [C, 1, K]; mlx-lm's sanitised checkpoints [C, K, 1]. Both are C rows of K taps.
    if (cw.shape != std::vector<int64_t>{C, K, 1}) check_shape(cw, {C, 1, K});
    g.conv.resize(size_t(C * K));
    for (int64_t i = 0; i < C * K; ++i) g.conv[size_t(i)] = read_float(cw, i);
    g.dt_bias = vec(p + "dt_bias", Hv, false);
    g.A_neg = vec(p + "A_log", Hv, false);
    for (auto& a : g.A_neg) a = -std::exp(a);
    g.norm = vec(p + "norm.weight", dv, false);
    g.out = linear(p + "out_proj", H, Hv * dv);
  }

  void attn(const std::string& p, AttnWeights& a) {
    const int64_t H = cfg_.hidden, hd = cfg_.head_dim;
    a.q = linear(p + "q_proj", cfg_.n_heads * 2 * hd, H);
    a.k = linear(p + "k_proj", cfg_.n_kv_heads * hd, H);
    a.v = linear(p + "v_proj", cfg_.n_kv_heads * hd, H);
    a.o = linear(p + "o_proj", H, cfg_.n_heads * hd);
    a.q_norm = vec(p + "q_norm.weight", hd, !norms_shifted_);
    a.k_norm = vec(p + "k_norm.weight", hd, !norms_shifted_);
  }

  void layer(const std::string& p, LayerKind kind, bool moe, LayerWeights& L) {
    const int64_t H = cfg_.hidden;
    L.kind = kind;
    L.input_norm = vec(p + "input_layernorm.weight", H, !norms_shifted_);
    L.post_norm = vec(p + "post_attention_layernorm.weight", H, !norms_shifted_);
    if (kind == LayerKind::LinearAttention) gdn(p + "linear_attn.", L.gdn);
    else attn(p + "self_attn.", L.attn);
    ffn(p + "mlp.", moe, L.ffn);
  }

  // A zero-centred norm weight of the checkpoint, folded to (1 + w) unless already stored that way.
  std::vector<float> norm(const std::string& name, int64_t n) { return vec(name, n, !norms_shifted_); }

  // The dense MLP's width comes from config.json's intermediate_size: a checkpoint whose gate/up rows or
  // down columns say otherwise is named together with the field.
  void check_dense_width(const std::string& base, bool rows) {
    const auto s = stored_shape(ck_, cfg_, base);
    if (!s) return;  // absent: load_linear names it
    const int64_t I = cfg_.dense_inter, want = s->padded ? (I + 127) / 128 * 128 : I, have = rows ? s->out : s->in;
    if (have >= 0 && have != want)
      fail("{}/config.json: intermediate_size is {} but tensor '{}' has shape {} ({} {}{})", ck_.dir(), I, s->tensor->name,
           s->tensor->shape_str(), have, rows ? "rows" : "columns", s->padded ? ", padded to 128" : "");
  }

  void ffn(const std::string& p, bool moe, FfnWeights& f) {
    const int64_t H = cfg_.hidden;
    f.moe = moe;
    if (!moe) {
      const int64_t I = cfg_.dense_inter;
      check_dense_width(p + "gate_proj", true);
      check_dense_width(p + "up_proj", true);
      check_dense_width(p + "down_proj", false);
      f.shared.gate = linear(p + "gate_proj", I, H);
      f.shared.up = linear(p + "up_proj", I, H);
      f.shared.down = linear(p + "down_proj", H, I);
      return;
    }
    f.router = linear(p + "gate", cfg_.n_experts, H);
    f.experts = experts(p);
    if (cfg_.shared_inter > 0) {
      const int64_t Is = cfg_.shared_inter;
      f.shared.gate = linear(p + "shared_expert.gate_proj", Is, H);
      f.shared.up = linear(p + "shared_expert.up_proj", Is, H);
      f.shared.down = linear(p + "shared_expert.down_proj", H, Is);
      f.shared_gate = linear(p + "shared_expert_gate", 1, H);
    }
  }

 private:
  const ModelConfig& cfg_;
  const Checkpoint& ck_;
  ModelWeights& w_;
  bool norms_shifted_;
};

bool has_matrix(const Checkpoint& ck, const std::string& base) {
  return ck.find(base + ".weight") || ck.find(base + ".trellis") || ck.find(base + ".scales");
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Names of the checkpoint's tensors under `prefix`.
std::vector<std::string> tensors_under(const Checkpoint& ck, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto it = ck.tensors().lower_bound(prefix); it != ck.tensors().end() && starts_with(it->first, prefix); ++it)
    out.push_back(it->first);
  return out;
}

// The MTP block: HF keeps it at the top level ("mtp.") in every layout; some converters nest it.
void load_mtp(Loader& ld, const Checkpoint& ck, const ModelConfig& cfg, ModelWeights& w) {
  std::string mp;
  std::vector<std::string> names;
  for (const char* p : {"mtp.", "model.mtp.", "language_model.mtp."}) {
    names = tensors_under(ck, p);
    if (!names.empty()) {
      mp = p;
      break;
    }
  }
  const std::string declared =
      cfg.mtp_layers < 0 ? std::string() : fmt::format("config.json field '{}' is {}", cfg.mtp_field, cfg.mtp_layers);
  if (names.empty()) {
    const char* need = "'mtp.fc.weight', 'mtp.pre_fc_norm_embedding.weight', 'mtp.pre_fc_norm_hidden.weight', "
                       "'mtp.layers.0.*', 'mtp.norm.weight'";
    w.mtp_absent = cfg.mtp_layers > 0
                       ? fmt::format("{}: {} but the checkpoint holds no MTP tensors (missing {}; converters such as "
                                     "mlx-lm drop them)", ck.dir(), declared, need)
                       : fmt::format("{}: the checkpoint has no MTP block (missing {})", ck.dir(), need);
    return;
  }
  if (cfg.mtp_layers == 0) fail("{}: {} but the checkpoint holds MTP tensors ('{}', ...)", ck.dir(), declared, names[0]);
  for (const auto& n : names) {
    const std::string lp = mp + "layers.";
    if (!starts_with(n, lp)) continue;
    const std::string idx = n.substr(lp.size(), n.find('.', lp.size()) - lp.size());
    if (idx != "0")
      fail("{}: tensor '{}' belongs to MTP layer {}, but {}", ck.dir(), n, idx,
           declared.empty() ? std::string("lily runs checkpoints with one MTP layer") : declared);
  }
  const int64_t H = cfg.hidden;
  MtpWeights m;
  m.prefix = mp;
  try {
    m.norm_embed = ld.norm(mp + "pre_fc_norm_embedding.weight", H);
    m.norm_hidden = ld.norm(mp + "pre_fc_norm_hidden.weight", H);
    m.fc = ld.linear(mp + "fc", H, 2 * H);
    ld.layer(mp + "layers.0.", LayerKind::FullAttention, cfg.n_experts > 0, m.layer);
    m.final_norm = ld.norm(mp + "norm.weight", H);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{} (the checkpoint's MTP block, {} tensors under '{}'{})", e.what(), names.size(), mp,
                                 declared.empty() ? std::string() : "; " + declared));
  }
  w.mtp = std::move(m);
}

}  // namespace

Linear select_rows(const Linear& src, const std::vector<int64_t>& rows, std::vector<std::shared_ptr<void>>& owned) {
  Linear l = src;
  l.out = int64_t(rows.size());
  switch (src.format) {
    case WeightFormat::Dense: {
      size_t es = dtype_size(src.dense.dtype), row_bytes = size_t(src.in) * es;
      auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[rows.size() * row_bytes]);
      for (size_t i = 0; i < rows.size(); ++i)
        std::memcpy(buf.get() + i * row_bytes,
                    static_cast<const uint8_t*>(src.dense.data) + size_t(rows[i] * src.dense.row_stride) * es, row_bytes);
      l.dense = {src.dense.dtype, buf.get(), src.in};
      owned.push_back(std::shared_ptr<void>(buf, buf.get()));
      return l;
    }
    default:
      return select_rows_quantized(src, rows, owned);
  }
}

size_t Linear::nbytes() const {
  switch (format) {
    case WeightFormat::Dense: return size_t(out * in) * dtype_size(dense.dtype);
    default: return quantized_nbytes(*this);
  }
}

std::shared_ptr<ModelWeights> ModelWeights::load(const std::string& dir) {
  auto cfg = ModelConfig::load(dir);
  return load(cfg, std::make_shared<Checkpoint>(dir));
}

std::shared_ptr<ModelWeights> ModelWeights::load(const ModelConfig& cfg, std::shared_ptr<Checkpoint> ckpt) {
  auto w = std::make_shared<ModelWeights>();
  w->cfg = cfg;
  w->ckpt = ckpt;
  // Tensor prefix: the config's, or mlx-lm's "language_model.model." for Qwen3.5 conversions.
  std::string P = cfg.tensor_prefix, head = "lm_head";
  if (!has_matrix(*ckpt, P + "embed_tokens") && has_matrix(*ckpt, "language_model.model.embed_tokens")) {
    P = "language_model.model.";
    head = "language_model.lm_head";
  }
  // mlx-lm's sanitize() moves the conv taps last ([C, K, 1]) and stores zero-centred norms as 1 + w.
  bool norms_shifted = false;
  for (int64_t i = 0; i < cfg.layers; ++i)
    if (cfg.layer_kinds[size_t(i)] == LayerKind::LinearAttention) {
      if (auto* cw = ckpt->find(P + "layers." + std::to_string(i) + ".linear_attn.conv1d.weight"))
        norms_shifted = cw->shape.size() == 3 && cw->shape[2] == 1 && cw->shape[1] > 1;
      break;
    }
  Loader ld(cfg, *ckpt, *w, norms_shifted);
  const int64_t H = cfg.hidden, V = cfg.vocab;
  w->embed = ld.linear(P + "embed_tokens", V, H);
  if (has_matrix(*ckpt, head))
    w->lm_head = ld.linear(head, V, H);
  else if (cfg.tie_embeddings)
    w->lm_head = w->embed;
  else
    fail("{}: missing tensor '{}.weight' (and tie_word_embeddings is false)", ckpt->dir(), head);
  w->final_norm = ld.vec(P + "norm.weight", H, !norms_shifted);
  for (int64_t i = 0; i < cfg.rotary_dim / 2; ++i) {
    float f = float(1.0 / std::pow(cfg.rope_theta, double(2 * i) / double(cfg.rotary_dim)));
    if (cfg.rope_freq_dtype == DType::BF16) f = bf16_to_f32(f32_to_bf16(f));
    if (cfg.rope_freq_dtype == DType::F16) f = f16_to_f32(f32_to_f16(f));
    w->rope_inv_freq.push_back(f);
  }
  w->layers.resize(size_t(cfg.layers));
  for (int64_t i = 0; i < cfg.layers; ++i)
    ld.layer(P + "layers." + std::to_string(i) + ".", cfg.layer_kinds[size_t(i)], cfg.layer_is_moe[size_t(i)],
             w->layers[size_t(i)]);
  load_mtp(ld, *ckpt, cfg, *w);
  return w;
}

namespace {

// Matrix bytes of one layer; `active`: only top_k of the routed experts (those read per token).
size_t layer_bytes(const LayerWeights& L, bool active, int64_t top_k) {
  auto ex = [](const Expert& e) { return e.gate.nbytes() + e.up.nbytes() + e.down.nbytes(); };
  size_t n = 0;
  if (L.kind == LayerKind::LinearAttention)
    n += L.gdn.in_qkv.nbytes() + L.gdn.in_z.nbytes() + L.gdn.in_b.nbytes() + L.gdn.in_a.nbytes() + L.gdn.out.nbytes();
  else
    n += L.attn.q.nbytes() + L.attn.k.nbytes() + L.attn.v.nbytes() + L.attn.o.nbytes();
  if (L.ffn.moe) {
    n += L.ffn.router.nbytes() + L.ffn.shared_gate.nbytes();
    if (!active)
      for (auto& e : L.ffn.experts) n += ex(e);
    else if (!L.ffn.experts.empty())
      n += size_t(top_k) * ex(L.ffn.experts[0]);
  }
  return n + ex(L.ffn.shared);
}

}  // namespace

const MtpWeights& ModelWeights::require_mtp() const {
  if (!mtp) fail("{}", mtp_absent.empty() ? std::string("the model has no MTP block (no mtp.* tensors)") : mtp_absent);
  return *mtp;
}

size_t ModelWeights::weight_bytes() const {
  size_t n = embed.nbytes() + (lm_head.same_storage(embed) ? 0 : lm_head.nbytes());
  for (auto& L : layers) n += layer_bytes(L, false, cfg.top_k);
  return n;
}

size_t ModelWeights::active_bytes_per_token() const {
  size_t n = lm_head.nbytes() + size_t(cfg.hidden) * 2;  // head + one embedding row
  for (auto& L : layers) n += layer_bytes(L, true, cfg.top_k);
  return n;
}

size_t ModelWeights::mtp_weight_bytes() const { return mtp ? mtp->fc.nbytes() + layer_bytes(mtp->layer, false, cfg.top_k) : 0; }

size_t ModelWeights::mtp_active_bytes_per_token() const {
  return mtp ? mtp->fc.nbytes() + layer_bytes(mtp->layer, true, cfg.top_k) : 0;
}

}  // namespace lily
