#include "tools/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/load_linear.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3_quant.h"

namespace lily {

namespace {

// ---- deterministic random streams ----

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Fills n 64-bit words of stream `key` in parallel; block b of 4096 words uses its own sub-stream.
void fill_words(uint64_t key, uint64_t* out, int64_t n) {
  const int64_t B = 4096;
  ThreadPool::global().parallel_for((n + B - 1) / B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      uint64_t s = key ^ (uint64_t(b) * 0xD1B54A32D192ED03ull);
      for (int64_t i = b * B; i < std::min(n, (b + 1) * B); ++i) out[i] = splitmix(s);
    }
  });
}

float unit(uint64_t bits) { return float(bits >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // U(-1, 1)

struct Buffer {
  std::shared_ptr<uint8_t[]> data;
  size_t nbytes = 0;
};

Buffer alloc(size_t n) {
  Buffer b;
  b.data = std::shared_ptr<uint8_t[]>(new uint8_t[(n + 7) / 8 * 8]);
  b.nbytes = n;
  return b;
}

// bf16 values U(-a, a), `n` of them.
Buffer uniform_bf16(uint64_t key, int64_t n, float a) {
  Buffer b = alloc(size_t(n) * 2);
  std::vector<uint64_t> w(size_t((n + 3) / 4));
  fill_words(key, w.data(), int64_t(w.size()));
  uint16_t* p = reinterpret_cast<uint16_t*>(b.data.get());
  ThreadPool::global().parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      uint64_t r = w[size_t(i / 4)] >> (16 * (i % 4));
      p[i] = f32_to_bf16(a * (float(r & 0xFFFF) * (2.0f / 65535.0f) - 1.0f));
    }
  });
  return b;
}

Buffer f32_buffer(const std::vector<float>& v) {
  Buffer b = alloc(v.size() * 4);
  std::memcpy(b.data.get(), v.data(), v.size() * 4);
  return b;
}

// ---- one tensor set: the in-memory Linear plus what goes to disk ----

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Buffer buf;
};

struct Sink {
  std::vector<Tensor> tensors;           // for the writer
  std::vector<std::shared_ptr<void>>* owned = nullptr;  // for the in-memory model
  void keep(const Buffer& b) {
    if (owned) owned->push_back(std::shared_ptr<void>(b.data, b.data.get()));
  }
  void add(std::string name, DType dt, std::vector<int64_t> shape, const Buffer& b) {
    keep(b);
    tensors.push_back({std::move(name), dt, std::move(shape), b});
  }
};

enum class Storage { Quantized, Float, Head };

class Gen {
 public:
  Gen(const SynthOptions& o, const ModelConfig& c) : o_(o), c_(c) {}

  // A shapes-only matrix (SynthOptions::shapes_only): sizes and format, no data.
  Linear shape(const std::string& base, int64_t out, int64_t in) const {
    Linear l;
    l.name = base;
    l.out = out;
    l.in = in;
    l.dense = {DType::BF16, nullptr, in};
    return l;
  }

  Linear dense(Sink& s, const std::string& base, int64_t out, int64_t in, float a = 0) {
    if (o_.shapes_only) return shape(base, out, in);
    if (a == 0) a = std::sqrt(3.0f / float(in));
    Buffer b = uniform_bf16(name_key(o_.seed, base), out * in, a);
    s.add(base + ".weight", DType::BF16, {out, in}, b);
    Linear l;
    l.name = base;
    l.out = out;
    l.in = in;
    l.format = WeightFormat::Dense;
    l.dense = {DType::BF16, b.data.get(), in};
    return l;
  }

  // Router / equal-norm rows: each row scaled to unit L2 norm.
  Linear router(Sink& s, const std::string& base, int64_t out, int64_t in) {
    if (o_.shapes_only) return shape(base, out, in);
    Buffer b = alloc(size_t(out * in) * 2);
    std::vector<uint64_t> w(static_cast<size_t>(out * in));
    fill_words(name_key(o_.seed, base), w.data(), out * in);
    uint16_t* p = reinterpret_cast<uint16_t*>(b.data.get());
    for (int64_t r = 0; r < out; ++r) {
      double ss = 0;
      std::vector<float> row(static_cast<size_t>(in));
      for (int64_t i = 0; i < in; ++i) { row[size_t(i)] = unit(w[size_t(r * in + i)]); ss += row[size_t(i)] * row[size_t(i)]; }
      float k = float(1.0 / std::sqrt(std::max(ss, 1e-30)));
      for (int64_t i = 0; i < in; ++i) p[r * in + i] = f32_to_bf16(row[size_t(i)] * k);
    }
    s.add(base + ".weight", DType::BF16, {out, in}, b);
    Linear l;
    l.name = base;
    l.out = out;
    l.in = in;
    l.dense = {DType::BF16, b.data.get(), in};
    return l;
  }

  Linear affine(Sink& s, const std::string& base, int64_t out, int64_t in, int bits) {
    const int gs = 64;
    if (in % gs != 0) fail("synth: '{}' has {} inputs, not a multiple of the affine group size {}", base, in, gs);
    const int64_t words = in * bits / 32, G = in / gs;
    auto q = std::make_shared<quant::AffineWeight>();
    q->bits = bits;
    q->group_size = gs;
    q->out = out;
    q->in = in;
    q->row_words = words;
    q->scale_dtype = DType::BF16;
    Linear l = shape(base, out, in);
    l.format = WeightFormat::Affine;
    if (o_.shapes_only) {
      l.affine = std::move(q);
      return l;
    }
    Buffer packed = alloc(size_t(out * words) * 4);
    const uint64_t key = name_key(o_.seed, base);
    fill_words(key, reinterpret_cast<uint64_t*>(packed.data.get()), (out * words + 1) / 2);
    const float a = std::sqrt(3.0f / float(in));
    Buffer sc = alloc(size_t(out * G) * 2), bi = alloc(size_t(out * G) * 2);
    const uint16_t scale = f32_to_bf16(2 * a / float((1 << bits) - 1)), bias = f32_to_bf16(-a);
    std::fill_n(reinterpret_cast<uint16_t*>(sc.data.get()), out * G, scale);
    std::fill_n(reinterpret_cast<uint16_t*>(bi.data.get()), out * G, bias);
    s.add(base + ".weight", DType::U32, {out, words}, packed);
    s.add(base + ".scales", DType::BF16, {out, G}, sc);
    s.add(base + ".biases", DType::BF16, {out, G}, bi);
    q->packed = reinterpret_cast<const uint32_t*>(packed.data.get());
    q->scales = sc.data.get();
    q->biases = bi.data.get();
    quant::affine_validate(*q, base.c_str());
    l.affine = std::move(q);
    return l;
  }

  Linear exl3(Sink& s, const std::string& base, int64_t out, int64_t in, int K) {
    const int64_t in_p = (in + 127) / 128 * 128, out_p = (out + 127) / 128 * 128;
    const int64_t nw = in_p / 16 * (out_p / 16) * 16 * K;
    auto q = std::make_shared<quant::Exl3Weight>();
    q->K = K;
    q->codebook = o_.codebook;
    q->in = in;
    q->out = out;
    q->in_p = in_p;
    q->out_p = out_p;
    Linear l = shape(base, out, in);
    l.format = WeightFormat::Exl3;
    if (o_.shapes_only) {
      l.exl3 = std::move(q);
      return l;
    }
    const uint64_t key = name_key(o_.seed, base);
    Buffer tr = alloc(size_t(nw) * 2);
    fill_words(key, reinterpret_cast<uint64_t*>(tr.data.get()), (nw + 3) / 4);
    Buffer suh = alloc(size_t(in_p) * 2), svh = alloc(size_t(out_p) * 2);
    std::vector<uint64_t> signs(static_cast<size_t>((in_p + out_p) / 64 + 2));
    fill_words(key ^ 0x5157ull, signs.data(), int64_t(signs.size()));
    auto sign = [&](int64_t i) { return (signs[size_t(i / 64)] >> (i % 64)) & 1 ? -1.0f : 1.0f; };
    const float sv = float(1.0 / (std::sqrt(double(in)) * quant::exl3_codebook_std(o_.codebook)));
    auto* su16 = reinterpret_cast<uint16_t*>(suh.data.get());
    auto* sv16 = reinterpret_cast<uint16_t*>(svh.data.get());
    for (int64_t i = 0; i < in_p; ++i) su16[i] = f32_to_f16(sign(i));
    for (int64_t j = 0; j < out_p; ++j) sv16[j] = f32_to_f16(sign(in_p + j) * sv);
    s.add(base + ".trellis", DType::I16, {in_p / 16, out_p / 16, 16 * K}, tr);
    s.add(base + ".suh", DType::F16, {in_p}, suh);
    s.add(base + ".svh", DType::F16, {out_p}, svh);
    if (o_.codebook != quant::Exl3Codebook::Inst3) {
      Buffer m = alloc(4);
      uint32_t v = o_.codebook == quant::Exl3Codebook::Mcg ? quant::kExl3McgMult : quant::kExl3Mul1Mult;
      std::memcpy(m.data.get(), &v, 4);
      s.add(base + (o_.codebook == quant::Exl3Codebook::Mcg ? ".mcg" : ".mul1"), DType::I32, {}, m);
    }
    q->trellis = reinterpret_cast<const uint16_t*>(tr.data.get());
    q->suh = su16;
    q->svh = sv16;
    quant::exl3_validate(*q, base.c_str());
    l.exl3 = std::move(q);
    return l;
  }

  Linear linear(Sink& s, const std::string& base, int64_t out, int64_t in, Storage role) {
    switch (o_.format) {
      case SynthFormat::BF16: return dense(s, base, out, in);
      case SynthFormat::Affine4: return role == Storage::Float ? dense(s, base, out, in) : affine(s, base, out, in, 4);
      case SynthFormat::Affine8: return role == Storage::Float ? dense(s, base, out, in) : affine(s, base, out, in, 8);
      case SynthFormat::Exl3:
        if (role == Storage::Float) return dense(s, base, out, in);
        return exl3(s, base, out, in, role == Storage::Head ? std::max(6, o_.exl3_bits) : o_.exl3_bits);
    }
    return {};
  }

  std::vector<float> vec(Sink& s, const std::string& name, int64_t n, float center, float spread) {
    std::vector<uint64_t> w(static_cast<size_t>(n));
    fill_words(name_key(o_.seed, name), w.data(), n);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = center + spread * unit(w[size_t(i)]);
    // On disk as bf16-representable float32 values.
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
    s.add(name, DType::F32, {n}, f32_buffer(v));
    return v;
  }

  // Zero-centred norm weight: stored w, used as (1 + w).
  std::vector<float> norm(Sink& s, const std::string& name, int64_t n) {
    auto v = vec(s, name, n, 0.0f, 0.1f);
    for (auto& x : v) x += 1.0f;
    return v;
  }

  void globals(Sink& s, ModelWeights& w) {
    const std::string P = c_.tensor_prefix;
    // Embedding: quantized like the matrices for affine (mlx-lm does), 16-bit for EXL3 (exllamav3 does).
    w.embed = o_.format == SynthFormat::Exl3 ? dense(s, P + "embed_tokens", c_.vocab, c_.hidden, 1.0f)
                                              : linear(s, P + "embed_tokens", c_.vocab, c_.hidden, Storage::Quantized);
    // Tied: the head is the embedding, except in EXL3, where exllamav3 keeps a quantized copy as lm_head.
    if (c_.tie_embeddings && o_.format != SynthFormat::Exl3) w.lm_head = w.embed;
    else w.lm_head = linear(s, "lm_head", c_.vocab, c_.hidden, Storage::Head);
    w.final_norm = norm(s, P + "norm.weight", c_.hidden);
  }

  void layer(Sink& s, int64_t i, LayerWeights& L) {
    layer(s, c_.tensor_prefix + "layers." + std::to_string(i) + ".", c_.layer_kinds[size_t(i)], c_.layer_is_moe[size_t(i)], L);
  }

  // The MTP block under "mtp." (HF's names), drawn like a full-attention layer.
  void mtp(Sink& s, MtpWeights& m) {
    const int64_t H = c_.hidden;
    m.prefix = "mtp.";
    m.norm_embed = norm(s, "mtp.pre_fc_norm_embedding.weight", H);
    m.norm_hidden = norm(s, "mtp.pre_fc_norm_hidden.weight", H);
    m.fc = linear(s, "mtp.fc", H, 2 * H, Storage::Quantized);
    layer(s, "mtp.layers.0.", LayerKind::FullAttention, c_.n_experts > 0, m.layer);
    m.final_norm = norm(s, "mtp.norm.weight", H);
  }

  void layer(Sink& s, const std::string& p, LayerKind kind, bool moe, LayerWeights& L) {
    const int64_t H = c_.hidden, Hk = c_.lin_k_heads, Hv = c_.lin_v_heads, dk = c_.lin_k_dim, dv = c_.lin_v_dim;
    L.kind = kind;
    L.input_norm = norm(s, p + "input_layernorm.weight", H);
    L.post_norm = norm(s, p + "post_attention_layernorm.weight", H);
    if (L.kind == LayerKind::LinearAttention) {
      const std::string q = p + "linear_attn.";
      auto& g = L.gdn;
      const int64_t C = c_.conv_channels(), K = c_.conv_kernel;
      if (c_.arch == Arch::Qwen3Next && !o_.shapes_only) {
        // Random weights: the grouped qkvz / ba rows are as random as the flat ones; the loader's
        // regrouping is replayed here so memory and disk hold the same model.
        Linear qkvz = linear(s, q + "in_proj_qkvz", 2 * Hk * dk + 2 * Hv * dv, H, Storage::Quantized);
        Linear ba = linear(s, q + "in_proj_ba", 2 * Hv, H, Storage::Float);
        const int64_t r = Hv / Hk, B = 2 * dk + 2 * r * dv;
        std::vector<int64_t> qkv_rows, z_rows, b_rows, a_rows;
        for (int64_t k = 0; k < 2; ++k)
          for (int64_t h = 0; h < Hk; ++h)
            for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(h * B + k * dk + d);
        for (int64_t j = 0; j < Hv; ++j) {
          int64_t h = j / r, e = j % r;
          for (int64_t d = 0; d < dv; ++d) {
            qkv_rows.push_back(h * B + 2 * dk + e * dv + d);
            z_rows.push_back(h * B + 2 * dk + r * dv + e * dv + d);
          }
          b_rows.push_back(h * 2 * r + e);
          a_rows.push_back(h * 2 * r + r + e);
        }
        auto& own = *owned_;
        g.in_qkv = select_rows(qkvz, qkv_rows, own);
        g.in_z = select_rows(qkvz, z_rows, own);
        g.in_b = select_rows(ba, b_rows, own);
        g.in_a = select_rows(ba, a_rows, own);
      } else {
        g.in_qkv = linear(s, q + "in_proj_qkv", C, H, Storage::Quantized);
        g.in_z = linear(s, q + "in_proj_z", Hv * dv, H, Storage::Quantized);
        g.in_b = linear(s, q + "in_proj_b", Hv, H, Storage::Float);
        g.in_a = linear(s, q + "in_proj_a", Hv, H, Storage::Float);
      }
      {
        std::vector<uint64_t> w(static_cast<size_t>(C * K));
        fill_words(name_key(o_.seed, q + "conv1d.weight"), w.data(), C * K);
        g.conv.resize(size_t(C * K));
        const float a = std::sqrt(3.0f / float(K));
        for (int64_t j = 0; j < C * K; ++j) g.conv[size_t(j)] = bf16_to_f32(f32_to_bf16(a * unit(w[size_t(j)])));
        Buffer b = f32_buffer(g.conv);
        s.add(q + "conv1d.weight", DType::F32, {C, 1, K}, b);
      }
      g.dt_bias = vec(s, q + "dt_bias", Hv, 0.0f, 0.5f);
      auto a_log = vec(s, q + "A_log", Hv, 0.0f, 1.0f);
      g.A_neg.resize(a_log.size());
      for (size_t j = 0; j < a_log.size(); ++j) g.A_neg[j] = -std::exp(a_log[j]);
      g.norm = vec(s, q + "norm.weight", dv, 1.0f, 0.1f);
      g.out = linear(s, q + "out_proj", H, Hv * dv, Storage::Quantized);
    } else {
      const std::string q = p + "self_attn.";
      const int64_t hd = c_.head_dim;
      L.attn.q = linear(s, q + "q_proj", c_.n_heads * 2 * hd, H, Storage::Quantized);
      L.attn.k = linear(s, q + "k_proj", c_.n_kv_heads * hd, H, Storage::Quantized);
      L.attn.v = linear(s, q + "v_proj", c_.n_kv_heads * hd, H, Storage::Quantized);
      L.attn.o = linear(s, q + "o_proj", H, c_.n_heads * hd, Storage::Quantized);
      L.attn.q_norm = norm(s, q + "q_norm.weight", hd);
      L.attn.k_norm = norm(s, q + "k_norm.weight", hd);
    }
    const std::string m = p + "mlp.";
    auto& f = L.ffn;
    f.moe = moe;
    if (!f.moe) {
      f.shared.gate = linear(s, m + "gate_proj", c_.dense_inter, H, Storage::Quantized);
      f.shared.up = linear(s, m + "up_proj", c_.dense_inter, H, Storage::Quantized);
      f.shared.down = linear(s, m + "down_proj", H, c_.dense_inter, Storage::Quantized);
      return;
    }
    const int64_t E = c_.n_experts, I = c_.moe_inter, Is = c_.shared_inter;
    f.router = router(s, m + "gate", E, H);
    f.experts.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string b = m + "experts." + std::to_string(e) + ".";
      f.experts[size_t(e)].gate = linear(s, b + "gate_proj", I, H, Storage::Quantized);
      f.experts[size_t(e)].up = linear(s, b + "up_proj", I, H, Storage::Quantized);
      f.experts[size_t(e)].down = linear(s, b + "down_proj", H, I, Storage::Quantized);
    }
    if (Is > 0) {
      f.shared.gate = linear(s, m + "shared_expert.gate_proj", Is, H, Storage::Quantized);
      f.shared.up = linear(s, m + "shared_expert.up_proj", Is, H, Storage::Quantized);
      f.shared.down = linear(s, m + "shared_expert.down_proj", H, Is, Storage::Quantized);
      f.shared_gate = dense(s, m + "shared_expert_gate", 1, H);
    }
  }

  std::vector<std::shared_ptr<void>>* owned_ = nullptr;

 private:
  const SynthOptions& o_;
  const ModelConfig& c_;
};

}  // namespace

std::shared_ptr<ModelWeights> synth_model(const SynthOptions& opt) {
  auto cfgj = synth_config(opt);
  auto w = std::make_shared<ModelWeights>();
  w->cfg = ModelConfig::from_json(cfgj, "synth:" + opt.preset);
  Gen g(opt, w->cfg);
  g.owned_ = &w->owned;
  Sink s;
  s.owned = &w->owned;
  g.globals(s, *w);
  s.tensors.clear();
  // Derived tables ModelWeights::load fills from the config.
  const auto& c = w->cfg;
  for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
    float f = float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.rotary_dim)));
    if (c.rope_freq_dtype == DType::BF16) f = bf16_to_f32(f32_to_bf16(f));
    if (c.rope_freq_dtype == DType::F16) f = f16_to_f32(f32_to_f16(f));
    w->rope_inv_freq.push_back(f);
  }
  w->layers.resize(size_t(w->cfg.layers));
  for (int64_t i = 0; i < w->cfg.layers; ++i) {
    g.layer(s, i, w->layers[size_t(i)]);
    s.tensors.clear();  // buffers stay alive through w->owned
    if (opt.progress) fmt::print(stderr, "\rsynth: layer {}/{}", i + 1, w->cfg.layers);
  }
  w->mtp.emplace();
  g.mtp(s, *w->mtp);
  if (opt.progress) fmt::print(stderr, "\n");
  return w;
}

SynthWriteResult write_synth(const SynthOptions& opt, const std::string& dir) {
  auto t0 = std::chrono::steady_clock::now();
  namespace fs = std::filesystem;
  auto cfgj = synth_config(opt);
  ModelConfig cfg = ModelConfig::from_json(cfgj, "synth:" + opt.preset);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create directory ({})", dir, ec.message());
  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream f(fs::path(dir) / name);
    f << text;
    if (!f) fail("{}/{}: write failed", dir, name);
  };
  write_text("config.json", cfgj.dump(2) + "\n");
  write_text("generation_config.json", nlohmann::json({{"eos_token_id", cfg.vocab - 1}}).dump(2) + "\n");
  const int shards = int(cfg.layers) + 2;  // embeddings / head, the layers, the MTP block
  SynthWriteResult res;
  res.shards = shards;
  nlohmann::json weight_map = nlohmann::json::object();
  Gen g(opt, cfg);
  for (int sh = 0; sh < shards; ++sh) {
    std::vector<std::shared_ptr<void>> owned;
    g.owned_ = &owned;
    Sink s;
    ModelWeights scratch;
    scratch.cfg = cfg;
    if (sh == 0) {
      g.globals(s, scratch);
    } else if (sh <= cfg.layers) {
      LayerWeights L;
      g.layer(s, sh - 1, L);
    } else {
      MtpWeights m;
      g.mtp(s, m);
    }
    const std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", sh + 1, shards);
    std::vector<TensorToWrite> tw;
    for (auto& t : s.tensors) {
      tw.push_back({t.name, t.dtype, t.shape, t.buf.data.get(), t.buf.nbytes});
      weight_map[t.name] = fname;
      res.bytes += t.buf.nbytes;
    }
    write_safetensors((fs::path(dir) / fname).string(), tw, {{"format", "pt"}});
    if (opt.progress) fmt::print(stderr, "\rsynth: shard {}/{} ({:.2f} GB so far)", sh + 1, shards, double(res.bytes) / 1e9);
  }
  if (opt.progress) fmt::print(stderr, "\n");
  nlohmann::json index = {{"metadata", {{"total_size", res.bytes}}}, {"weight_map", weight_map}};
  write_text("model.safetensors.index.json", index.dump(1) + "\n");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

Linear synth_router(const SynthOptions& opt, int64_t layer, std::vector<std::shared_ptr<void>>& owned) {
  ModelConfig cfg = ModelConfig::from_json(synth_config(opt), "synth:" + opt.preset);
  if (layer < 0 || layer >= cfg.layers) fail("synth: layer {} out of range [0, {})", layer, cfg.layers);
  Gen g(opt, cfg);
  Sink s;
  s.owned = &owned;
  return g.router(s, cfg.tensor_prefix + "layers." + std::to_string(layer) + ".mlp.gate", cfg.n_experts, cfg.hidden);
}

RouterSpread router_spread(const Linear& router, int64_t top_k, int64_t samples, uint64_t seed) {
  RouterSpread r;
  r.experts = router.out;
  r.top_k = top_k;
  r.samples = samples;
  const int64_t E = router.out, H = router.in;
  std::vector<float> W(static_cast<size_t>(E * H));
  for (int64_t e = 0; e < E; ++e) cpu::weight_row(router, e, W.data() + e * H);
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  uint64_t st = seed;
  std::vector<float> x(static_cast<size_t>(H)), logit(static_cast<size_t>(E));
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t n = 0; n < samples; ++n) {
    for (int64_t i = 0; i < H; i += 2) {  // Box-Muller N(0, 1)
      double u1 = (double(splitmix(st) >> 11) + 1) / 9007199254740993.0, u2 = double(splitmix(st) >> 11) / 9007199254740992.0;
      double m = std::sqrt(-2 * std::log(u1));
      x[size_t(i)] = float(m * std::cos(6.283185307179586 * u2));
      if (i + 1 < H) x[size_t(i + 1)] = float(m * std::sin(6.283185307179586 * u2));
    }
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0;
      for (int64_t i = 0; i < H; ++i) acc += W[size_t(e * H + i)] * x[size_t(i)];
      logit[size_t(e)] = acc;
      idx[size_t(e)] = e;
    }
    std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                      [&](int64_t a, int64_t b) { return logit[size_t(a)] > logit[size_t(b)]; });
    for (int64_t k = 0; k < top_k; ++k) ++count[size_t(idx[size_t(k)])];
  }
  const double expect = double(samples) * double(top_k) / double(E);
  r.min_share = 1e30;
  for (auto c : count) {
    r.used += c > 0;
    r.min_share = std::min(r.min_share, double(c) / expect);
    r.max_share = std::max(r.max_share, double(c) / expect);
  }
  return r;
}

}  // namespace lily
