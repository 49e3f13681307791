#include "model/load_linear.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"

namespace lily {

namespace {

Linear dense_linear(const TensorInfo& t, const std::string& base, int64_t out, int64_t in) {
  if (!dtype_is_float(t.dtype) || t.dtype == DType::F64)
    fail("{}: tensor '{}' has dtype {}; a dense weight must be BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
  if (t.shape != std::vector<int64_t>{out, in})
    fail("{}: tensor '{}' has shape {}, expected [{}, {}]", t.file, t.name, t.shape_str(), out, in);
  Linear l;
  l.name = base;
  l.out = out;
  l.in = in;
  l.format = WeightFormat::Dense;
  l.dense = {t.dtype, t.data, in};
  return l;
}

std::string shape_of(std::vector<int64_t> s) {
  TensorInfo t;
  t.shape = std::move(s);
  return t.shape_str();
}

// bits / group_size that config.json's quantization block gives `path` (a per-module override first).
// {0, 0} when the block says nothing; bits -1 when the module is explicitly left unquantized.
std::pair<int, int> affine_config(const ModelConfig& cfg, const std::string& path) {
  const auto& q = cfg.quantization;
  if (!q.is_object()) return {0, 0};
  auto get = [&](const nlohmann::json& o, const char* k, int def) {
    auto it = o.find(k);
    return it != o.end() && it->is_number_integer() ? it->get<int>() : def;
  };
  int bits = get(q, "bits", 0), group = get(q, "group_size", 0);
  // mlx-lm keys per-module entries by the module path; Qwen3.5 checkpoints may name the text model
  // "language_model.model." where our tensor names say "model.language_model.".
  std::vector<std::string> keys = {path};
  const std::string hf = "model.language_model.";
  if (path.rfind(hf, 0) == 0) keys.push_back("language_model.model." + path.substr(hf.size()));
  for (const auto& key : keys) {
    auto it = q.find(key);
    if (it == q.end()) continue;
    if (it->is_boolean() && !it->get<bool>()) return {-1, 0};
    if (it->is_object()) return {get(*it, "bits", bits), get(*it, "group_size", group)};
  }
  return {bits, group};
}

void check_mode(const ModelConfig& cfg, const std::string& where) {
  if (cfg.quantization.is_object()) {
    auto it = cfg.quantization.find("mode");
    if (it != cfg.quantization.end() && it->is_string() && it->get<std::string>() != "affine")
      fail("{}: quantization mode '{}' is not supported (only MLX 'affine')", where, it->get<std::string>());
  }
}

// An affine weight from (possibly stacked) tensors; `lead` = index into a leading [E] dimension or -1.
std::shared_ptr<quant::AffineWeight> affine_from(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base,
                                                 const std::string& path, int64_t lead, int64_t E, int64_t out,
                                                 int64_t in) {
  const auto& w = ck.get(base + ".weight");
  const auto& s = ck.get(base + ".scales");
  const auto* bp = ck.find(base + ".biases");
  if (!bp) fail("{}: tensor '{}.scales' present but '{}.biases' missing (only MLX affine is supported)", ck.dir(), base, base);
  const auto& b = *bp;
  check_mode(cfg, base);
  if (w.dtype != DType::U32 && w.dtype != DType::I32)
    fail("{}: tensor '{}' has dtype {}, expected U32 packed codes", w.file, w.name, dtype_name(w.dtype));
  if (s.dtype != b.dtype) fail("{}: '{}' is {} but '{}' is {}", s.file, s.name, dtype_name(s.dtype), b.name, dtype_name(b.dtype));
  const size_t nd = lead >= 0 ? 3 : 2;
  if (w.shape.size() != nd || s.shape.size() != nd || b.shape != s.shape)
    fail("{}: affine tensors of '{}' have shapes {}, {}, {}; expected {} dimensions", w.file, base, w.shape_str(),
         s.shape_str(), b.shape_str(), nd);
  const int64_t words = w.shape[nd - 1], G = s.shape[nd - 1];
  auto lead_ok = [&](const TensorInfo& t) { return lead < 0 || t.shape[0] == E; };
  if (!lead_ok(w) || !lead_ok(s) || w.shape[nd - 2] != out || s.shape[nd - 2] != out)
    fail("{}: tensor '{}' has shape {}, expected {} rows of {} inputs{}", w.file, w.name, w.shape_str(), out, in,
         lead >= 0 ? fmt::format(" for {} experts", E) : std::string());
  if (G <= 0 || in % G != 0 || (words * 32) % in != 0)
    fail("{}: tensor '{}' shape {} with scales {} does not fit an input width of {}", w.file, w.name, w.shape_str(),
         s.shape_str(), in);
  auto q = std::make_shared<quant::AffineWeight>();
  q->bits = int(words * 32 / in);
  q->group_size = int(in / G);
  auto [cbits, cgroup] = affine_config(cfg, path);
  if (cbits > 0 && (cbits != q->bits || (cgroup > 0 && cgroup != q->group_size)))
    fail("{}: tensor '{}' holds {}-bit codes in groups of {}, but config.json's quantization block says bits {} group_size {}",
         w.file, w.name, q->bits, q->group_size, cbits, cgroup);
  q->out = out;
  q->in = in;
  q->row_words = words;
  q->scale_dtype = s.dtype;
  const int64_t e = lead < 0 ? 0 : lead;
  q->packed = reinterpret_cast<const uint32_t*>(w.data) + e * out * words;
  q->scales = s.data + size_t(e * out * G) * dtype_size(s.dtype);
  q->biases = b.data + size_t(e * out * G) * dtype_size(b.dtype);
  quant::affine_validate(*q, w.name.c_str());
  return q;
}

Linear affine_linear(std::shared_ptr<quant::AffineWeight> q, const std::string& name) {
  Linear l;
  l.name = name;
  l.out = q->out;
  l.in = q->in;
  l.format = WeightFormat::Affine;
  l.affine = std::move(q);
  return l;
}

int64_t round128(int64_t v) { return (v + 127) / 128 * 128; }

Linear exl3_linear(const Checkpoint& ck, const std::string& base, int64_t out, int64_t in,
                   std::vector<std::shared_ptr<void>>& owned) {
  const auto& tr = ck.get(base + ".trellis");
  if (tr.dtype != DType::I16 && tr.dtype != DType::U16)
    fail("{}: tensor '{}' has dtype {}, expected I16", tr.file, tr.name, dtype_name(tr.dtype));
  const int64_t in_p = round128(in), out_p = round128(out);
  if (tr.shape.size() != 3 || tr.shape[0] != in_p / 16 || tr.shape[1] != out_p / 16 || tr.shape[2] % 16 != 0 ||
      tr.shape[2] < 16 || tr.shape[2] > 128)
    fail("{}: tensor '{}' has shape {}, expected [{}, {}, 16·K] with K in 1..8 (in {} -> {}, out {} -> {})", tr.file,
         tr.name, tr.shape_str(), in_p / 16, out_p / 16, in, in_p, out, out_p);
  auto w = std::make_shared<quant::Exl3Weight>();
  w->K = int(tr.shape[2] / 16);
  w->in = in;
  w->out = out;
  w->in_p = in_p;
  w->out_p = out_p;
  w->trellis = reinterpret_cast<const uint16_t*>(tr.data);
  auto vec16 = [&](const char* sfx, int64_t n, const char* legacy) -> const uint16_t* {
    const auto* t = ck.find(base + sfx);
    if (!t) {
      if (ck.find(base + legacy))
        fail("{}: '{}{}' holds legacy packed sign bits; only checkpoints with '{}' are supported", ck.dir(), base,
             legacy, sfx);
      fail("{}: missing tensor '{}{}'", ck.dir(), base, sfx);
    }
    if (t->dtype != DType::F16 || t->shape != std::vector<int64_t>{n})
      fail("{}: tensor '{}' is {} {}, expected F16 [{}]", t->file, t->name, dtype_name(t->dtype), t->shape_str(), n);
    return reinterpret_cast<const uint16_t*>(t->data);
  };
  w->suh = vec16(".suh", in_p, ".su");
  w->svh = vec16(".svh", out_p, ".sv");
  const auto* mcg = ck.find(base + ".mcg");
  const auto* mul1 = ck.find(base + ".mul1");
  if (mcg && mul1) fail("{}: '{}' has both .mcg and .mul1 codebook markers", ck.dir(), base);
  auto marker = [&](const TensorInfo& t, uint32_t want, const char* cb) {
    if ((t.dtype != DType::I32 && t.dtype != DType::U32) || t.numel() != 1)
      fail("{}: tensor '{}' must be a scalar I32 codebook marker, got {} {}", t.file, t.name, dtype_name(t.dtype),
           t.shape_str());
    uint32_t v;
    std::memcpy(&v, t.data, 4);
    if (v != want)
      fail("{}: tensor '{}' holds codebook multiplier 0x{:08X}; only the {} multiplier 0x{:08X} is supported", t.file,
           t.name, v, cb, want);
  };
  w->codebook = quant::Exl3Codebook::Inst3;
  if (mcg) {
    marker(*mcg, quant::kExl3McgMult, "MCG");
    w->codebook = quant::Exl3Codebook::Mcg;
  }
  if (mul1) {
    marker(*mul1, quant::kExl3Mul1Mult, "MUL1");
    w->codebook = quant::Exl3Codebook::Mul1;
  }
  if (const auto* b = ck.find(base + ".bias")) {
    if (b->shape.size() != 1 || (b->shape[0] != out_p && b->shape[0] != out) ||
        (b->dtype != DType::F16 && b->dtype != DType::F32 && b->dtype != DType::BF16))
      fail("{}: tensor '{}' is {} {}, expected F16 [{}]", b->file, b->name, dtype_name(b->dtype), b->shape_str(), out_p);
    if (b->dtype == DType::F16 && b->shape[0] == out_p) {
      w->bias = reinterpret_cast<const uint16_t*>(b->data);
    } else {  // stored as float32/bf16 or unpadded: converted to padded fp16 as exllamav3 does on load
      auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[size_t(out_p)]());
      for (int64_t i = 0; i < b->shape[0]; ++i) {
        float v;
        if (b->dtype == DType::F32) std::memcpy(&v, b->data + 4 * i, 4);
        else {
          uint16_t h;
          std::memcpy(&h, b->data + 2 * i, 2);
          v = b->dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        buf[size_t(i)] = f32_to_f16(v);
      }
      w->bias = buf.get();
      owned.push_back(std::shared_ptr<void>(buf, buf.get()));
    }
  }
  quant::exl3_validate(*w, tr.name.c_str());
  Linear l;
  l.name = base;
  l.out = out;
  l.in = in;
  l.format = WeightFormat::Exl3;
  l.exl3 = std::move(w);
  return l;
}

}  // namespace

Linear load_linear(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base, int64_t out, int64_t in,
                   std::vector<std::shared_ptr<void>>& owned) {
  const TensorInfo* w = ck.find(base + ".weight");
  if (ck.find(base + ".trellis")) return exl3_linear(ck, base, out, in, owned);
  if (w && dtype_is_float(w->dtype)) return dense_linear(*w, base, out, in);
  if (w && ck.find(base + ".scales")) return affine_linear(affine_from(ck, cfg, base, base, -1, 0, out, in), base);
  if (!w) fail("{}: missing tensor '{}.weight'", ck.dir(), base);
  fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32 (or U32 with .scales/.biases)", w->file, w->name,
       dtype_name(w->dtype));
}

std::optional<StoredShape> stored_shape(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base) {
  if (const auto* tr = ck.find(base + ".trellis")) {
    if (tr->shape.size() != 3) return StoredShape{tr, -1, -1, true};
    return StoredShape{tr, tr->shape[1] * 16, tr->shape[0] * 16, true};
  }
  const auto* w = ck.find(base + ".weight");
  if (!w || w->shape.size() != 2) return std::nullopt;
  if (dtype_is_float(w->dtype)) return StoredShape{w, w->shape[0], w->shape[1], false};
  const int bits = affine_config(cfg, base).first;
  return StoredShape{w, w->shape[0], bits > 0 ? w->shape[1] * 32 / bits : -1, false};
}

bool load_stacked_experts(const Checkpoint& ck, const ModelConfig& cfg, const std::string& p,
                          std::vector<Expert>& experts, std::vector<std::shared_ptr<void>>& owned) {
  const int64_t E = cfg.n_experts, I = cfg.moe_inter, H = cfg.hidden;
  struct Proj {
    const char* name;
    int64_t out, in;
    Linear Expert::*field;
  };
  const Proj projs[3] = {{"gate_proj", I, H, &Expert::gate}, {"up_proj", I, H, &Expert::up}, {"down_proj", H, I, &Expert::down}};
  experts.resize(size_t(E));
  // mlx-lm: switch_mlp.{gate,up,down}_proj with a leading [E] dimension (affine or float).
  if (ck.find(p + "switch_mlp.gate_proj.weight")) {
    for (const auto& pr : projs) {
      const std::string base = p + "switch_mlp." + pr.name;
      const auto& t = ck.get(base + ".weight");
      for (int64_t e = 0; e < E; ++e) {
        const std::string name = base + "[" + std::to_string(e) + "]";
        Linear l;
        if (dtype_is_float(t.dtype) && t.dtype != DType::F64) {
          if (t.shape != std::vector<int64_t>{E, pr.out, pr.in})
            fail("{}: tensor '{}' has shape {}, expected {}", t.file, t.name, t.shape_str(), shape_of({E, pr.out, pr.in}));
          l.name = name;
          l.out = pr.out;
          l.in = pr.in;
          l.dense = {t.dtype, t.data + size_t(e * pr.out * pr.in) * dtype_size(t.dtype), pr.in};
        } else {
          l = affine_linear(affine_from(ck, cfg, base, base, e, E, pr.out, pr.in), name);
        }
        experts[size_t(e)].*pr.field = l;
      }
    }
    return true;
  }
  // exllamav3: per-expert EXL3 tensors; all experts of one projection must share K and codebook.
  if (ck.find(p + "experts.0.gate_proj.trellis")) {
    for (const auto& pr : projs) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string base = p + "experts." + std::to_string(e) + "." + pr.name;
        Linear l = load_linear(ck, cfg, base, pr.out, pr.in, owned);
        const Linear& first = experts[0].*pr.field;
        if (e > 0 && l.format != first.format)
          fail("{}: '{}' is {} but expert 0 of the same projection is {}", ck.dir(), base, format_name(l.format),
               format_name(first.format));
        if (e > 0 && l.format == WeightFormat::Exl3 &&
            (l.exl3->K != first.exl3->K || l.exl3->codebook != first.exl3->codebook))
          fail("{}: '{}' uses K={} {} but expert 0 uses K={} {}; mixed K within one expert projection is not supported",
               ck.dir(), base, l.exl3->K, quant::exl3_codebook_name(l.exl3->codebook), first.exl3->K,
               quant::exl3_codebook_name(first.exl3->codebook));
        experts[size_t(e)].*pr.field = l;
      }
    }
    return true;
  }
  // Not stacked: leave E default experts for the per-expert loader to fill.
  experts.assign(static_cast<size_t>(E), Expert{});
  return false;
}

Linear select_rows_quantized(const Linear& src, const std::vector<int64_t>& rows,
                             std::vector<std::shared_ptr<void>>& owned) {
  for (int64_t r : rows)
    if (r < 0 || r >= src.out) fail("{}: row {} out of range [0, {})", src.name, r, src.out);
  Linear l = src;
  l.out = int64_t(rows.size());
  if (src.format == WeightFormat::Affine) {
    // Rows are independent: gather packed rows, scales and biases.
    const auto& a = *src.affine;
    const int64_t G = a.groups(), n = l.out;
    const size_t ss = dtype_size(a.scale_dtype);
    auto packed = std::shared_ptr<uint32_t[]>(new uint32_t[size_t(n * a.row_words)]);
    auto sc = std::shared_ptr<uint8_t[]>(new uint8_t[size_t(n * G) * ss]);
    auto bi = std::shared_ptr<uint8_t[]>(new uint8_t[size_t(n * G) * ss]);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[size_t(i)];
      std::memcpy(packed.get() + i * a.row_words, a.packed + r * a.row_words, size_t(a.row_words) * 4);
      std::memcpy(sc.get() + size_t(i * G) * ss, static_cast<const uint8_t*>(a.scales) + size_t(r * G) * ss, size_t(G) * ss);
      std::memcpy(bi.get() + size_t(i * G) * ss, static_cast<const uint8_t*>(a.biases) + size_t(r * G) * ss, size_t(G) * ss);
    }
    auto q = std::make_shared<quant::AffineWeight>(a);
    q->out = n;
    q->packed = packed.get();
    q->scales = sc.get();
    q->biases = bi.get();
    owned.push_back(std::shared_ptr<void>(packed, packed.get()));
    owned.push_back(std::shared_ptr<void>(sc, sc.get()));
    owned.push_back(std::shared_ptr<void>(bi, bi.get()));
    l.affine = std::move(q);
    return l;
  }
  if (src.format == WeightFormat::Exl3) {
    // Output channels are mixed by the output Hadamard: keep the whole product, gather afterwards.
    const auto& x = *src.exl3;
    auto g = std::shared_ptr<int32_t[]>(new int32_t[rows.size()]);
    for (size_t i = 0; i < rows.size(); ++i) g[i] = int32_t(x.column(rows[i]));
    auto q = std::make_shared<quant::Exl3Weight>(x);
    q->out = l.out;
    q->out_rows = g.get();
    owned.push_back(std::shared_ptr<void>(g, g.get()));
    l.exl3 = std::move(q);
    return l;
  }
  fail("{}: cannot regroup rows of a {} weight", src.name, format_name(src.format));
}

Linear row_prefix(const Linear& src, int64_t n) {
  if (n < 1 || n > src.out) fail("{}: a prefix of {} rows of a {}-row weight", src.name, n, src.out);
  Linear l = src;
  l.out = n;
  if (src.format == WeightFormat::Dense) return l;
  if (src.format == WeightFormat::Affine && src.affine) {
    auto q = std::make_shared<quant::AffineWeight>(*src.affine);
    q->out = n;
    l.affine = std::move(q);
    return l;
  }
  return Linear{};
}

size_t quantized_nbytes(const Linear& l) {
  if (l.format == WeightFormat::Affine && l.affine) return l.affine->nbytes();
  if (l.format == WeightFormat::Exl3 && l.exl3) return l.exl3->nbytes();
  fail("{}: size of {} weights unknown", l.name, format_name(l.format));
}

}  // namespace lily
