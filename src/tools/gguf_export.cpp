#include "tools/gguf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace lily {

using gguf::TensorType;

gguf::TensorType parse_gguf_type(const std::string& s) {
  if (s == "f32") return TensorType::F32;
  if (s == "bf16") return TensorType::BF16;
  if (s == "q8_0") return TensorType::Q8_0;
  if (s == "q4_0") return TensorType::Q4_0;
  fail("--type: '{}' is not one of f32, bf16, q8_0, q4_0", s);
}

std::vector<int64_t> tiled_value_heads(int64_t k_heads, int64_t v_heads) {
  const int64_t r = v_heads / k_heads;
  std::vector<int64_t> src(static_cast<size_t>(v_heads));
  for (int64_t g = 0; g < k_heads; ++g)
    for (int64_t i = 0; i < r; ++i) src[size_t(i * k_heads + g)] = g * r + i;
  return src;
}

namespace {

// A float matrix [rows, cols] filled on demand (PyTorch order: row-major, cols contiguous).
using Fill = std::function<void(float* dst)>;

void dense_row(const Linear& l, int64_t r, float* out) {
  if (l.format != WeightFormat::Dense)
    fail("{}: export-gguf reads float weights only; this tensor is {} (export from a bf16/f16/f32 checkpoint)",
         l.name, format_name(l.format));
  const auto& d = l.dense;
  const size_t es = dtype_size(d.dtype);
  const uint8_t* p = static_cast<const uint8_t*>(d.data) + size_t(r * d.row_stride) * es;
  for (int64_t c = 0; c < l.in; ++c) {
    switch (d.dtype) {
      case DType::F32: std::memcpy(out + c, p + 4 * c, 4); break;
      case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * c, 2); out[c] = bf16_to_f32(h); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * c, 2); out[c] = f16_to_f32(h); break; }
      default: fail("{}: unsupported dense dtype {}", l.name, dtype_name(d.dtype));
    }
  }
}

// Rows of `l` in the given order (all rows when `rows` is empty).
Fill rows_of(const Linear& l, std::vector<int64_t> rows = {}) {
  return [&l, rows = std::move(rows)](float* dst) {
    int64_t n = rows.empty() ? l.out : int64_t(rows.size());
    ThreadPool::global().parallel_for(n, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dense_row(l, rows.empty() ? i : rows[size_t(i)], dst + i * l.in);
    });
  };
}

class Exporter {
 public:
  Exporter(const ModelWeights& w, const GgufExportOptions& opt) : w_(w), c_(w.cfg), opt_(opt) {
    // llama.cpp's names: qwen3next, qwen35moe, and qwen35 for the dense Qwen3.5 family.
    arch_ = c_.arch == Arch::Qwen3Next ? "qwen3next" : c_.arch == Arch::Qwen35 ? "qwen35" : "qwen35moe";
  }

  void run(const std::string& out) {
    metadata();
    tokenizer();
    tensors();
    gguf::write_file(out, kvs_, specs_);
  }

 private:
  // ---- tensors ----
  void add(const std::string& name, std::vector<int64_t> pt_shape, bool force_f32, Fill fill) {
    gguf::TensorSpec s;
    s.name = name;
    s.ne.assign(pt_shape.rbegin(), pt_shape.rend());
    TensorType t = force_f32 || pt_shape.size() < 2 ? TensorType::F32 : opt_.type;
    if (s.ne[0] % gguf::block_size(t) != 0) t = TensorType::BF16;
    s.type = t;
    int64_t n = 1;
    for (auto d : pt_shape) n *= d;
    const int64_t cols = s.ne[0];
    const bool progress = opt_.progress;
    s.produce = [fill = std::move(fill), t, n, cols, name, progress](uint8_t* out) {
      if (progress) fmt::print(stderr, "  {} ({})\n", name, gguf::type_name(t));
      std::vector<float> buf(static_cast<size_t>(n));
      fill(buf.data());
      const int64_t rows = n / cols;
      const size_t rb = gguf::row_bytes(t, cols);
      ThreadPool::global().parallel_for(rows, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) gguf::encode(t, buf.data() + r * cols, cols, out + size_t(r) * rb);
      });
    };
    specs_.push_back(std::move(s));
  }

  void matrix(const std::string& name, const Linear& l, std::vector<int64_t> rows = {}) {
    int64_t n = rows.empty() ? l.out : int64_t(rows.size());
    add(name, {n, l.in}, false, rows_of(l, std::move(rows)));
  }
  void router(const std::string& name, const Linear& l) { add(name, {l.out, l.in}, true, rows_of(l)); }
  void vec(const std::string& name, const std::vector<float>& v) {
    add(name, {int64_t(v.size())}, true, [&v](float* d) { std::memcpy(d, v.data(), v.size() * 4); });
  }

  // Experts stacked [E, rows, cols] from one Linear per expert.
  void experts(const std::string& name, const std::vector<Expert>& ex, Linear Expert::*which) {
    const Linear& l0 = ex[0].*which;
    const int64_t E = int64_t(ex.size()), R = l0.out, C = l0.in;
    add(name, {E, R, C}, false, [&ex, which, R, C, E](float* d) {
      ThreadPool::global().parallel_for(E * R, 256, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dense_row(ex[size_t(i / R)].*which, i % R, d + i * C);
      });
    });
  }

  void tensors() {
    matrix("token_embd.weight", w_.embed);
    vec("output_norm.weight", w_.final_norm);
    if (!w_.lm_head.same_storage(w_.embed)) matrix("output.weight", w_.lm_head);  // tied: llama.cpp reuses token_embd
    for (int64_t il = 0; il < c_.layers; ++il) layer(il, w_.layers[size_t(il)]);
    if (with_mtp()) {
      // The MTP block as llama.cpp's converter writes it: one more layer n_layer, plus its nextn tensors.
      const auto& m = *w_.mtp;
      const std::string b = fmt::format("blk.{}.", c_.layers);
      layer(c_.layers, m.layer);
      matrix(b + "nextn.eh_proj.weight", m.fc);
      vec(b + "nextn.enorm.weight", m.norm_embed);
      vec(b + "nextn.hnorm.weight", m.norm_hidden);
      vec(b + "nextn.shared_head_norm.weight", m.final_norm);
    }
  }

  bool with_mtp() const { return opt_.mtp && w_.mtp.has_value(); }

  void layer(int64_t il, const LayerWeights& L) {
    const int64_t Hk = c_.lin_k_heads, Hv = c_.lin_v_heads, dk = c_.lin_k_dim, dv = c_.lin_v_dim, K = c_.conv_kernel;
    const bool tiled = c_.arch != Arch::Qwen3Next && Hk != Hv;
    std::vector<int64_t> vh(static_cast<size_t>(Hv));  // vh[p] = HF value head stored at position p
    if (tiled) vh = tiled_value_heads(Hk, Hv);
    else for (int64_t j = 0; j < Hv; ++j) vh[size_t(j)] = j;
    auto head_rows = [&](int64_t base, int64_t dim) {
      std::vector<int64_t> rows;
      for (int64_t p = 0; p < Hv; ++p)
        for (int64_t d = 0; d < dim; ++d) rows.push_back(base + vh[size_t(p)] * dim + d);
      return rows;
    };
    const std::string b = fmt::format("blk.{}.", il);
    vec(b + "attn_norm.weight", L.input_norm);
    vec(b + "post_attention_norm.weight", L.post_norm);
    if (L.kind == LayerKind::FullAttention) {
      matrix(b + "attn_q.weight", L.attn.q);
      matrix(b + "attn_k.weight", L.attn.k);
      matrix(b + "attn_v.weight", L.attn.v);
      matrix(b + "attn_output.weight", L.attn.o);
      vec(b + "attn_q_norm.weight", L.attn.q_norm);
      vec(b + "attn_k_norm.weight", L.attn.k_norm);
    } else {
      const auto& g = L.gdn;
      const int64_t key = Hk * dk;
      std::vector<int64_t> qkv_rows;
      for (int64_t r = 0; r < 2 * key; ++r) qkv_rows.push_back(r);
      for (auto r : head_rows(2 * key, dv)) qkv_rows.push_back(r);
      matrix(b + "attn_qkv.weight", g.in_qkv, qkv_rows);
      matrix(b + "attn_gate.weight", g.in_z, head_rows(0, dv));
      // conv [C, K]: q‖k channels kept, v channels permuted like the qkv rows.
      add(b + "ssm_conv1d.weight", {int64_t(qkv_rows.size()), K}, true, [&g, qkv_rows, K](float* d) {
        for (size_t i = 0; i < qkv_rows.size(); ++i)
          std::memcpy(d + int64_t(i) * K, g.conv.data() + qkv_rows[i] * K, size_t(K) * 4);
      });
      auto perm_vec = [&](const std::vector<float>& v) {
        std::vector<float> o(v.size());
        for (int64_t p = 0; p < Hv; ++p) o[size_t(p)] = v[size_t(vh[size_t(p)])];
        return o;
      };
      owned_.push_back(perm_vec(g.dt_bias));
      vec(b + "ssm_dt.bias", owned_.back());
      owned_.push_back(perm_vec(g.A_neg));
      vec(b + "ssm_a", owned_.back());
      if (c_.arch == Arch::Qwen3Next) {
        // ssm_ba as stored by HF: per key head g, [b(r) | a(r)] of value heads g·r + i.
        const int64_t r = Hv / Hk;
        add(b + "ssm_ba.weight", {2 * Hv, g.in_b.in}, false, [&g, Hk, r](float* d) {
          const int64_t H = g.in_b.in;
          for (int64_t k = 0; k < Hk; ++k)
            for (int64_t i = 0; i < r; ++i) {
              dense_row(g.in_b, k * r + i, d + (k * 2 * r + i) * H);
              dense_row(g.in_a, k * r + i, d + (k * 2 * r + r + i) * H);
            }
        });
      } else {
        matrix(b + "ssm_beta.weight", g.in_b, head_rows(0, 1));
        matrix(b + "ssm_alpha.weight", g.in_a, head_rows(0, 1));
      }
      vec(b + "ssm_norm.weight", g.norm);
      // ssm_out [H, Hv·dv]: permute the input columns.
      std::vector<int64_t> cols = head_rows(0, dv);
      add(b + "ssm_out.weight", {g.out.out, g.out.in}, false, [&g, cols](float* d) {
        ThreadPool::global().parallel_for(g.out.out, 16, [&](int64_t s, int64_t e) {
          std::vector<float> row(size_t(g.out.in));
          for (int64_t r = s; r < e; ++r) {
            dense_row(g.out, r, row.data());
            for (size_t c = 0; c < cols.size(); ++c) d[r * g.out.in + int64_t(c)] = row[size_t(cols[c])];
          }
        });
      });
    }
    const auto& f = L.ffn;
    if (!f.moe) {
      if (c_.arch != Arch::Qwen35)
        fail("export-gguf: layer {} has a dense MLP; llama.cpp's {} expects MoE in every layer", il, arch_);
      matrix(b + "ffn_gate.weight", f.shared.gate);
      matrix(b + "ffn_up.weight", f.shared.up);
      matrix(b + "ffn_down.weight", f.shared.down);
      return;
    }
    router(b + "ffn_gate_inp.weight", f.router);
    experts(b + "ffn_gate_exps.weight", f.experts, &Expert::gate);
    experts(b + "ffn_up_exps.weight", f.experts, &Expert::up);
    experts(b + "ffn_down_exps.weight", f.experts, &Expert::down);
    if (!f.shared.gate.empty()) {
      add(b + "ffn_gate_inp_shexp.weight", {f.shared_gate.in}, true,
          [&f](float* d) { dense_row(f.shared_gate, 0, d); });
      matrix(b + "ffn_gate_shexp.weight", f.shared.gate);
      matrix(b + "ffn_up_shexp.weight", f.shared.up);
      matrix(b + "ffn_down_shexp.weight", f.shared.down);
    }
  }

  // ---- metadata ----
  void kv(const std::string& k, gguf::Value v) { kvs_.push_back({k, std::move(v)}); }
  void akv(const std::string& k, gguf::Value v) { kv(arch_ + "." + k, std::move(v)); }

  nlohmann::json read_json(const std::string& file) const {
    if (opt_.model_dir.empty()) return nullptr;
    auto p = std::filesystem::path(opt_.model_dir) / file;
    if (!std::filesystem::exists(p)) return nullptr;
    std::ifstream f(p);
    try {
      return nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail("{}: not valid JSON ({})", p.string(), e.what());
    }
  }

  void metadata() {
    auto u32 = [](int64_t v) { return gguf::Value(uint32_t(v)); };
    kv("general.architecture", arch_);
    kv("general.type", std::string("model"));
    kv("general.name", opt_.name.empty() ? std::string("lily export") : opt_.name);
    akv("block_count", u32(c_.layers + (with_mtp() ? 1 : 0)));
    if (with_mtp()) akv("nextn_predict_layers", u32(1));
    akv("context_length", u32(c_.max_positions > 0 ? c_.max_positions : 262144));
    akv("embedding_length", u32(c_.hidden));
    if (c_.dense_inter > 0) akv("feed_forward_length", u32(c_.dense_inter));
    akv("attention.head_count", u32(c_.n_heads));
    akv("attention.head_count_kv", u32(c_.n_kv_heads));
    akv("rope.freq_base", float(c_.rope_theta));
    akv("attention.layer_norm_rms_epsilon", float(c_.rms_eps));
    if (c_.n_experts > 0) {
      akv("expert_count", u32(c_.n_experts));
      akv("expert_used_count", u32(c_.top_k));
    }
    akv("attention.key_length", u32(c_.head_dim));
    akv("attention.value_length", u32(c_.head_dim));
    uint32_t ftype = 0;
    switch (opt_.type) {
      case TensorType::F32: ftype = 0; break;
      case TensorType::F16: ftype = 1; break;
      case TensorType::Q4_0: ftype = 2; break;
      case TensorType::Q8_0: ftype = 7; break;
      case TensorType::BF16: ftype = 32; break;
    }
    kv("general.file_type", ftype);
    if (opt_.type == TensorType::Q4_0 || opt_.type == TensorType::Q8_0) kv("general.quantization_version", uint32_t(2));
    if (c_.n_experts > 0) {
      akv("expert_feed_forward_length", u32(c_.moe_inter));
      akv("expert_shared_feed_forward_length", u32(c_.shared_inter));
    }
    akv("ssm.conv_kernel", u32(c_.conv_kernel));
    akv("ssm.state_size", u32(c_.lin_k_dim));
    akv("ssm.group_count", u32(c_.lin_k_heads));
    akv("ssm.time_step_rank", u32(c_.lin_v_heads));
    akv("ssm.inner_size", u32(c_.lin_v_dim * c_.lin_v_heads));
    std::vector<bool> recurrent;
    for (auto k : c_.layer_kinds) recurrent.push_back(k == LayerKind::LinearAttention);
    if (with_mtp()) recurrent.push_back(false);  // the MTP layer is full attention
    akv("attention.recurrent_layers", recurrent);
    auto cj = read_json("config.json");
    int64_t interval = 4;
    if (cj.is_object()) {
      const auto& t = cj.contains("text_config") ? cj["text_config"] : cj;
      if (t.contains("full_attention_interval") && t["full_attention_interval"].is_number_integer())
        interval = t["full_attention_interval"].get<int64_t>();
    }
    akv("full_attention_interval", u32(interval));
    akv("rope.dimension_count", u32(c_.rotary_dim));
    if (c_.arch != Arch::Qwen3Next) {
      std::vector<int32_t> sections = {11, 11, 10, 0};
      if (cj.is_object()) {
        const auto& t = cj.contains("text_config") ? cj["text_config"] : cj;
        const nlohmann::json* rp = t.contains("rope_parameters") ? &t["rope_parameters"] : nullptr;
        const nlohmann::json* ms = rp && rp->contains("mrope_section") ? &(*rp)["mrope_section"]
                                   : t.contains("rope_scaling") && t["rope_scaling"].is_object() &&
                                           t["rope_scaling"].contains("mrope_section")
                                       ? &t["rope_scaling"]["mrope_section"]
                                       : nullptr;
        if (ms && ms->is_array()) {
          sections.clear();
          for (auto& x : *ms) sections.push_back(x.get<int32_t>());
          sections.resize(4, 0);
        }
      }
      akv("rope.dimension_sections", sections);
    }
  }

  // ---- tokenizer ----
  static std::string byte_token(int b) {
    // GPT-2 byte-level map: printable bytes map to themselves, the rest to U+0100 + n.
    static std::vector<int> map = [] {
      std::vector<int> m(256, -1);
      for (int c = '!'; c <= '~'; ++c) m[size_t(c)] = c;
      for (int c = 0xA1; c <= 0xAC; ++c) m[size_t(c)] = c;
      for (int c = 0xAE; c <= 0xFF; ++c) m[size_t(c)] = c;
      int n = 0;
      for (int c = 0; c < 256; ++c)
        if (m[size_t(c)] < 0) m[size_t(c)] = 256 + n++;
      return m;
    }();
    int cp = map[size_t(b)];
    std::string s;
    if (cp < 0x80) s += char(cp);
    else { s += char(0xC0 | (cp >> 6)); s += char(0x80 | (cp & 0x3F)); }
    return s;
  }

  void tokenizer() {
    const int64_t V = c_.vocab;
    auto tj = read_json("tokenizer.json");
    std::vector<std::string> tokens(static_cast<size_t>(V));
    std::vector<int32_t> types(static_cast<size_t>(V), 1);
    kv("tokenizer.ggml.model", std::string("gpt2"));
    kv("tokenizer.ggml.pre", std::string(c_.arch == Arch::Qwen3Next ? "qwen2" : "qwen35"));
    std::vector<std::string> merges;
    int64_t eos = -1, pad = -1;
    if (tj.is_object() && tj.contains("model") && tj["model"].contains("vocab")) {
      std::vector<bool> have(static_cast<size_t>(V), false);
      for (auto& [tok, id] : tj["model"]["vocab"].items()) {
        int64_t i = id.get<int64_t>();
        if (i < 0 || i >= V) fail("{}/tokenizer.json: token id {} is outside the model's vocab of {}", opt_.model_dir, i, V);
        tokens[size_t(i)] = tok;
        have[size_t(i)] = true;
      }
      if (tj.contains("added_tokens"))
        for (auto& a : tj["added_tokens"]) {
          int64_t i = a["id"].get<int64_t>();
          if (i < 0 || i >= V) continue;
          tokens[size_t(i)] = a["content"].get<std::string>();
          have[size_t(i)] = true;
          types[size_t(i)] = a.value("special", false) ? 3 : 4;
          if (tokens[size_t(i)] == "<|endoftext|>") pad = i;
        }
      for (int64_t i = 0; i < V; ++i)
        if (!have[size_t(i)]) { tokens[size_t(i)] = fmt::format("[PAD{}]", i); types[size_t(i)] = 5; }
      if (tj["model"].contains("merges"))
        for (auto& m : tj["model"]["merges"]) {
          if (m.is_string()) merges.push_back(m.get<std::string>());
          else if (m.is_array() && m.size() == 2) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        }
    } else {
      // Synthetic: the 256 byte tokens, then filler; llama.cpp can load it and we feed ids directly.
      for (int64_t i = 0; i < V; ++i) tokens[size_t(i)] = i < 256 ? byte_token(int(i)) : fmt::format("[SYN{}]", i);
      if (V > 256) { types[size_t(V - 1)] = 3; tokens[size_t(V - 1)] = "<|endoftext|>"; pad = V - 1; }
    }
    if (!c_.eos_ids.empty() && c_.eos_ids[0] >= 0 && c_.eos_ids[0] < V) eos = c_.eos_ids[0];
    else if (pad >= 0) eos = pad;
    kv("tokenizer.ggml.tokens", tokens);
    kv("tokenizer.ggml.token_type", types);
    kv("tokenizer.ggml.merges", merges);
    if (eos >= 0) kv("tokenizer.ggml.eos_token_id", uint32_t(eos));
    if (pad >= 0) kv("tokenizer.ggml.padding_token_id", uint32_t(pad));
    kv("tokenizer.ggml.add_bos_token", false);
    auto tc = read_json("tokenizer_config.json");
    std::string tmpl;
    if (tc.is_object() && tc.contains("chat_template") && tc["chat_template"].is_string())
      tmpl = tc["chat_template"].get<std::string>();
    if (tmpl.empty() && !opt_.model_dir.empty()) {
      auto p = std::filesystem::path(opt_.model_dir) / "chat_template.jinja";
      if (std::filesystem::exists(p)) {
        std::ifstream f(p);
        tmpl.assign(std::istreambuf_iterator<char>(f), {});
      }
    }
    if (!tmpl.empty()) kv("tokenizer.chat_template", tmpl);
  }

  const ModelWeights& w_;
  const ModelConfig& c_;
  GgufExportOptions opt_;
  std::string arch_;
  std::vector<gguf::KV> kvs_;
  std::vector<gguf::TensorSpec> specs_;
  std::list<std::vector<float>> owned_;
};

}  // namespace

void export_gguf(const ModelWeights& w, const std::string& out, const GgufExportOptions& opt) {
  if (opt.type != TensorType::F32 && opt.type != TensorType::BF16 && opt.type != TensorType::Q8_0 &&
      opt.type != TensorType::Q4_0)
    fail("--type: {} is not an export type", gguf::type_name(opt.type));
  if (w.cfg.lin_k_dim != w.cfg.lin_v_dim)
    fail("export-gguf: llama.cpp requires linear_key_head_dim == linear_value_head_dim (got {} and {})",
         w.cfg.lin_k_dim, w.cfg.lin_v_dim);
  Exporter(w, opt).run(out);
}

}  // namespace lily
