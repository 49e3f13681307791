#include "tools/quantize.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3_quant.h"
#include "tools/calibrate.h"
#include "tools/synth.h"

namespace fs = std::filesystem;

namespace lily {

namespace {

enum class Role { Linear, Router, SharedGate, GdnBA, Embed, Head, Expert };

// One matrix of the output: rows [out, in] of `src` starting at element `offset`.
struct Job {
  std::string base;  // output name without suffix
  const TensorInfo* src = nullptr;
  size_t offset = 0;
  int64_t out = 0, in = 0;
  Role role = Role::Linear;
  std::string group;  // exl3 bit-allocation unit / affine stacking key (experts of one projection)
  int expert = -1;
  int K = 0;
};

std::vector<float> to_float(const TensorInfo& t, size_t offset, size_t n) {
  std::vector<float> v(n);
  const uint8_t* p = t.data + offset * dtype_size(t.dtype);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(&v[i], p + 4 * i, 4); break;
      case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); v[i] = bf16_to_f32(h); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); v[i] = f16_to_f32(h); break; }
      default: fail("{}: tensor '{}' has dtype {}, expected a float type", t.file, t.name, dtype_name(t.dtype));
    }
  }
  return v;
}

bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

bool is_mtp_tensor(const std::string& name) {
  for (const char* p : {"mtp.", "model.mtp.", "language_model.mtp."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

Role role_of(const std::string& base) {
  if (ends_with(base, ".mlp.gate")) return Role::Router;
  if (ends_with(base, "shared_expert_gate")) return Role::SharedGate;
  if (ends_with(base, "in_proj_ba") || ends_with(base, "in_proj_b") || ends_with(base, "in_proj_a")) return Role::GdnBA;
  if (ends_with(base, "embed_tokens")) return Role::Embed;
  if (base == "lm_head" || ends_with(base, ".lm_head")) return Role::Head;
  return Role::Linear;
}

// Output buffers stay alive until the file is written.
struct Writer {
  std::vector<TensorToWrite> tensors;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs;
  template <typename T>
  void add(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& data) {
    auto b = std::make_shared<std::vector<uint8_t>>(data.size() * sizeof(T));
    std::memcpy(b->data(), data.data(), b->size());
    bufs.push_back(b);
    tensors.push_back({name, dt, std::move(shape), b->data(), b->size()});
  }
  void copy(const TensorInfo& t) { tensors.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes}); }
  size_t bytes() const {
    size_t n = 0;
    for (auto& t : tensors) n += t.nbytes;
    return n;
  }
};

class Progress {
 public:
  Progress(int64_t total, bool on) : total_(total), on_(on), t0_(std::chrono::steady_clock::now()) {}
  void add(int64_t n) {
    int64_t d = done_ += n;
    if (!on_) return;
    auto now = std::chrono::steady_clock::now();
    std::lock_guard lk(mu_);
    if (d < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - t0_).count();
    int w = 30, f = total_ ? int(w * d / total_) : w;
    double rate = s > 0 ? double(d) / s : 0;
    fmt::print(stderr, "\rquantize [{}{}] {:3d}% {}/{} tiles  {:.0f} tiles/s  ETA {:.0f} s   ", std::string(size_t(f), '#'),
               std::string(size_t(w - f), '-'), total_ ? int(100 * d / total_) : 100, d, total_, rate,
               rate > 0 ? double(total_ - d) / rate : 0.0);
    if (d >= total_) fmt::print(stderr, "\n");
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  int64_t total_;
  bool on_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point t0_, last_;
};

void progress_cb(void* ctx, int64_t n) { static_cast<Progress*>(ctx)->add(n); }

int64_t pad128(int64_t v) { return (v + 127) / 128 * 128; }

// Copies tokenizer, generation config and other side files (everything but weights and config.json).
void copy_side_files(const std::string& from, const std::string& to) {
  for (auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (n == "config.json" || ends_with(n, ".safetensors") || ends_with(n, ".safetensors.index.json")) continue;
    fs::copy_file(e.path(), fs::path(to) / n, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

void exl3_allocate_bits(std::vector<Exl3Group>& groups, double bits) {
  if (!(bits >= 1 && bits <= 8)) fail("--bits {} is not supported for exl3 (1 to 8)", bits);
  const int k0 = int(std::floor(bits));
  double total = 0, have = 0;
  for (auto& g : groups) {
    g.K = k0;
    total += g.weights;
    have += g.weights * k0;
  }
  std::vector<Exl3Group*> order;
  for (auto& g : groups) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->priority < b->priority; });
  for (auto* g : order) {
    if (k0 >= 8 || have + g->weights > bits * total + 1e-9) continue;
    g->K = k0 + 1;
    have += g->weights;
  }
}

QuantizeResult quantize_model(const QuantizeOptions& opt) {
  const bool affine = opt.format == "affine";
  if (!affine && opt.format != "exl3") fail("--format '{}' is not supported (affine or exl3)", opt.format);
  if (affine) {
    if (opt.bits != std::floor(opt.bits) || !quant::affine_bits_supported(int(opt.bits)))
      fail("--bits {} is not supported for affine (2, 3, 4, 5, 6 or 8)", opt.bits);
    if (!quant::affine_group_supported(opt.group_size))
      fail("--group-size {} is not supported (32, 64 or 128)", opt.group_size);
    if (!opt.calibration.empty()) fail("--calibration applies to --format exl3 only");
  } else {
    if (!(opt.bits >= 1 && opt.bits <= 8)) fail("--bits {} is not supported for exl3 (1 to 8)", opt.bits);
    if (!(opt.head_bits == 16 || (opt.head_bits >= 1 && opt.head_bits <= 8)))
      fail("--head-bits {} is not supported (1..8, or 16 to keep lm_head unquantized)", opt.head_bits);
  }
  const quant::Exl3Codebook cb = affine ? quant::Exl3Codebook::Mcg : parse_codebook(opt.codebook);
  if (opt.out_dir.empty()) fail("--out is required");
  if (fs::exists(opt.out_dir) && fs::equivalent(opt.out_dir, opt.model_dir))
    fail("--out {} is the input model directory", opt.out_dir);

  const ModelConfig cfg = ModelConfig::load(opt.model_dir);
  if (!cfg.quant_method.empty())
    fail("{}: the model is already quantized ({}); quantize a float checkpoint", opt.model_dir, cfg.quant_method);
  nlohmann::json raw;
  try {
    raw = nlohmann::json::parse(read_text_file((fs::path(opt.model_dir) / "config.json").string()));
  } catch (const nlohmann::json::exception& e) {
    fail("{}/config.json: not valid JSON: {}", opt.model_dir, e.what());
  }
  Checkpoint ck(opt.model_dir);

  // Plan: every float matrix becomes a job; everything else is copied.
  std::vector<Job> jobs;
  std::vector<const TensorInfo*> passthrough;
  const std::regex per_expert(R"(^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$)");
  std::smatch m;
  for (const auto& [name, t] : ck.tensors()) {
    if (opt.keep_mtp && is_mtp_tensor(name)) {
      passthrough.push_back(t);
      continue;
    }
    if (std::regex_match(name, m, per_expert) && t->shape.size() == 2 && dtype_is_float(t->dtype)) {
      Job j;
      j.base = name.substr(0, name.size() - 7);
      j.src = t;
      j.out = t->shape[0];
      j.in = t->shape[1];
      j.role = Role::Expert;
      j.group = m[1].str() + "." + m[3].str();
      j.expert = std::stoi(m[2].str());
      jobs.push_back(j);
      continue;
    }
    if ((ends_with(name, ".mlp.experts.gate_up_proj") || ends_with(name, ".mlp.experts.down_proj")) && t->shape.size() == 3) {
      const std::string pre = name.substr(0, name.rfind(".experts."));
      const bool gu = ends_with(name, "gate_up_proj");
      const int64_t E = t->shape[0], rows = t->shape[1], in = t->shape[2];
      if (gu && rows % 2) fail("{}: tensor '{}' has an odd number of gate/up rows {}", t->file, name, rows);
      for (int64_t e = 0; e < E; ++e)
        for (int part = 0; part < (gu ? 2 : 1); ++part) {
          Job j;
          const std::string proj = gu ? (part == 0 ? "gate_proj" : "up_proj") : "down_proj";
          j.base = pre + ".experts." + std::to_string(e) + "." + proj;
          j.src = t;
          j.out = gu ? rows / 2 : rows;
          j.in = in;
          j.offset = size_t(e * rows * in + part * j.out * in);
          j.role = Role::Expert;
          j.group = pre + "." + proj;
          j.expert = int(e);
          jobs.push_back(j);
        }
      continue;
    }
    const bool matrix = ends_with(name, ".weight") && t->shape.size() == 2 && dtype_is_float(t->dtype) &&
                        name.find("norm") == std::string::npos && name.find("conv1d") == std::string::npos;
    if (!matrix) {
      passthrough.push_back(t);
      continue;
    }
    Job j;
    j.base = name.substr(0, name.size() - 7);
    j.src = t;
    j.out = t->shape[0];
    j.in = t->shape[1];
    j.role = role_of(j.base);
    j.group = j.base;
    jobs.push_back(j);
  }
  const bool has_head = std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.role == Role::Head; });
  if (!affine && !has_head && cfg.tie_embeddings) {
    // exllamav3 stores a tied head as its own quantized copy of the embedding.
    for (const auto& j : std::vector<Job>(jobs))
      if (j.role == Role::Embed) {
        Job h = j;
        h.base = "lm_head";
        h.group = "lm_head";
        h.role = Role::Head;
        jobs.push_back(h);
      }
  }

  fs::create_directories(opt.out_dir);
  Writer wr;
  for (auto* t : passthrough) wr.copy(*t);
  QuantizeResult res;
  nlohmann::json qblock;

  if (affine) {
    const int bits = int(opt.bits), g = opt.group_size;
    qblock = {{"group_size", g}, {"bits", bits}, {"mode", "affine"}};
    // Experts: quantize each, then stack per projection (mlx-lm's switch_mlp).
    std::map<std::string, std::vector<std::pair<int, quant::AffineQuantized>>> stacks;
    double wbits = 0, nweights = 0;
    for (const auto& j : jobs) {
      int b = bits, gs = g;
      if (j.role == Role::Router || j.role == Role::SharedGate) {
        b = 8;
        gs = 64;
      }
      if (j.in % gs != 0) {  // mlx-lm leaves such modules unquantized
        wr.copy(*j.src);
        continue;
      }
      auto w = to_float(*j.src, j.offset, size_t(j.out * j.in));
      auto q = quant::affine_quantize(w.data(), j.out, j.in, b, gs, DType::BF16);
      wbits += double(j.out * j.in) * (b + 32.0 / gs);
      nweights += double(j.out * j.in);
      ++res.tensors_quantized;
      if (j.role == Role::Expert) {
        stacks[j.group].push_back({j.expert, std::move(q)});
        continue;
      }
      if (b != bits || gs != g) qblock[j.base] = {{"group_size", gs}, {"bits", b}};
      wr.add(j.base + ".weight", DType::U32, {j.out, j.in * b / 32}, q.packed);
      wr.add(j.base + ".scales", DType::BF16, {j.out, j.in / gs}, q.scales);
      wr.add(j.base + ".biases", DType::BF16, {j.out, j.in / gs}, q.biases);
    }
    for (auto& [grp, list] : stacks) {
      std::sort(list.begin(), list.end(), [](auto& a, auto& b) { return a.first < b.first; });
      for (size_t e = 0; e < list.size(); ++e)
        if (list[e].first != int(e)) fail("{}: experts of '{}' are not numbered 0..{}", opt.model_dir, grp, list.size() - 1);
      const auto dot = grp.rfind('.');
      const std::string base = grp.substr(0, dot) + ".switch_mlp." + grp.substr(dot + 1);
      const int64_t E = int64_t(list.size()), out = list[0].second.out, in = list[0].second.in;
      std::vector<uint32_t> packed;
      std::vector<uint16_t> sc, bi;
      for (auto& [e, q] : list) {
        packed.insert(packed.end(), q.packed.begin(), q.packed.end());
        sc.insert(sc.end(), q.scales.begin(), q.scales.end());
        bi.insert(bi.end(), q.biases.begin(), q.biases.end());
      }
      wr.add(base + ".weight", DType::U32, {E, out, in * bits / 32}, packed);
      wr.add(base + ".scales", DType::BF16, {E, out, in / g}, sc);
      wr.add(base + ".biases", DType::BF16, {E, out, in / g}, bi);
    }
    res.bits_per_weight = nweights > 0 ? wbits / nweights : 0;
  } else {
    // Which matrices are EXL3 and at which K.
    std::vector<Job*> qjobs;
    for (auto& j : jobs) {
      const bool keep = j.role == Role::Router || j.role == Role::SharedGate || j.role == Role::GdnBA ||
                        j.role == Role::Embed || (j.role == Role::Head && opt.head_bits == 16);
      if (keep) {
        // (a tied head kept unquantized is the embedding itself: the loader falls back to it)
        if (!(j.role == Role::Head && j.src->name != j.base + ".weight")) wr.copy(*j.src);
        continue;
      }
      qjobs.push_back(&j);
    }
    // Integer K per allocation group: floor(bits), then +1 by priority until the average reaches bits.
    std::map<std::string, double> group_weights;
    std::map<std::string, int> group_prio;
    for (auto* j : qjobs) {
      if (j->role == Role::Head) continue;
      group_weights[j->group] += double(j->out * j->in);
      int p = 3;  // expert gate/up last
      if (j->role == Role::Linear) p = j->base.find("shared_expert") != std::string::npos ? 1 : 0;
      else if (ends_with(j->group, "down_proj")) p = 2;
      group_prio[j->group] = p;
    }
    std::vector<Exl3Group> groups;
    for (auto& [g, n] : group_weights) groups.push_back({g, n, group_prio[g], 0});
    exl3_allocate_bits(groups, opt.bits);
    std::map<std::string, int> group_k;
    for (auto& g : groups) group_k[g.name] = g.K;
    int64_t total_tiles = 0;
    for (auto* j : qjobs) {
      j->K = j->role == Role::Head ? opt.head_bits : group_k[j->group];
      total_tiles += pad128(j->out) / 16 * (pad128(j->in) / 16);
    }
    // Hessians from calibration tokens (one per distinct input stream).
    std::map<std::string, std::vector<double>> hess;
    if (!opt.calibration.empty()) {
      std::vector<std::string> names;
      for (auto* j : qjobs) names.push_back(j->base);
      hess = capture_hessians(opt.model_dir, opt.calibration, opt.calibration_tokens, names);
    }
    Progress prog(total_tiles, opt.progress);
    double wbits = 0, nweights = 0, proxy = 0;
    uint64_t seed = 1;
    for (auto* j : qjobs) {
      auto w = to_float(*j->src, j->offset, size_t(j->out * j->in));
      quant::Exl3QuantOptions qo;
      qo.K = j->K;
      qo.codebook = cb;
      qo.seed = seed++;
      auto hit = hess.find(j->base);
      if (hit != hess.end() && hit->second.size() == size_t(j->in * j->in)) qo.hessian = hit->second.data();
      qo.progress = progress_cb;
      qo.progress_ctx = &prog;
      auto q = quant::exl3_quantize(w.data(), j->out, j->in, nullptr, qo);
      proxy += q.proxy_err;
      wr.add(j->base + ".trellis", DType::I16, {q.in_p / 16, q.out_p / 16, 16 * int64_t(q.K)}, q.trellis);
      wr.add(j->base + ".suh", DType::F16, {q.in_p}, q.suh);
      wr.add(j->base + ".svh", DType::F16, {q.out_p}, q.svh);
      if (cb != quant::Exl3Codebook::Inst3) {
        const uint32_t mult = cb == quant::Exl3Codebook::Mcg ? quant::kExl3McgMult : quant::kExl3Mul1Mult;
        wr.add(j->base + (cb == quant::Exl3Codebook::Mcg ? ".mcg" : ".mul1"), DType::I32, {}, std::vector<uint32_t>{mult});
      }
      wbits += double(q.trellis.size()) * 16 + 16.0 * double(q.in_p + q.out_p);
      nweights += double(j->out * j->in);
      res.tiles += q.in_p / 16 * (q.out_p / 16);
      ++res.tensors_quantized;
    }
    res.seconds = prog.seconds();
    res.bits_per_weight = nweights > 0 ? wbits / nweights : 0;
    qblock = {{"quant_method", "exl3"},
              {"version", "lily"},
              {"bits", std::round(res.bits_per_weight * 100) / 100},
              {"head_bits", opt.head_bits},
              {"codebook", opt.codebook},
              {"out_scales", "always"},
              {"calibration", opt.calibration.empty() ? nlohmann::json(nullptr)
                                                      : nlohmann::json({{"tokens", opt.calibration_tokens}})}};
    res.proxy_err_mean = res.tensors_quantized ? proxy / double(res.tensors_quantized) : 0.0;
  }

  // Deterministic tensor order in the file.
  std::sort(wr.tensors.begin(), wr.tensors.end(), [](auto& a, auto& b) { return a.name < b.name; });
  write_safetensors((fs::path(opt.out_dir) / "model.safetensors").string(), wr.tensors,
                    nlohmann::json{{"format", affine ? "mlx" : "pt"}});
  res.bytes_written = wr.bytes();
  if (affine) {
    raw["quantization"] = qblock;
    raw["quantization_config"] = qblock;
  } else {
    raw["quantization_config"] = qblock;
  }
  copy_side_files(opt.model_dir, opt.out_dir);
  std::ofstream(fs::path(opt.out_dir) / "config.json") << raw.dump(2) << "\n";
  return res;
}

}  // namespace lily
