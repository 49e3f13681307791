#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/rank_driver.h"
#include "cli/registry.h"
#include "model/shard.h"
#include "model/weights.h"
#include "tools/synth.h"

namespace lily::cli {
namespace {

// The MTP block: present, where, formats of its matrices (name -> count), FFN kind, sizes.
nlohmann::json mtp_json(const ModelWeights& w) {
  if (!w.mtp) return {{"present", false}, {"declared_layers", w.cfg.mtp_layers < 0 ? nlohmann::json(nullptr) : nlohmann::json(w.cfg.mtp_layers)},
                      {"reason", w.mtp_absent}};
  const auto& m = *w.mtp;
  std::map<std::string, int> formats;
  auto count = [&](const Linear& l) {
    if (!l.empty()) ++formats[format_name(l.format)];
  };
  const auto& L = m.layer;
  for (const Linear* l : {&m.fc, &L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.ffn.router, &L.ffn.shared_gate,
                          &L.ffn.shared.gate, &L.ffn.shared.up, &L.ffn.shared.down})
    count(*l);
  for (const auto& e : L.ffn.experts)
    for (const Linear* l : {&e.gate, &e.up, &e.down}) count(*l);
  return {{"present", true},
          {"layers", 1},
          {"prefix", m.prefix},
          {"ffn", L.ffn.moe ? fmt::format("MoE {} experts", L.ffn.experts.size()) : std::string("dense MLP")},
          {"attention_format", format_name(L.attn.q.format)},
          {"fc_format", format_name(m.fc.format)},
          {"formats", formats},
          {"weight_bytes", w.mtp_weight_bytes()},
          {"active_bytes_per_draft", w.mtp_active_bytes_per_token()}};
}

// --devices N: each rank's share (model/shard.h): its heads, experts and vocabulary rows, and its bytes.
nlohmann::json ranks_json(const ModelWeights& w, int n) {
  const ShardPlan p = ShardPlan::make(w, n);
  nlohmann::json a = nlohmann::json::array();
  auto range = [](const Range& r) { return nlohmann::json::array({r.begin, r.end}); };
  for (int r = 0; r < n; ++r) {
    const RankPlan& rp = p.rank[size_t(r)];
    int whole_ffn = 0;
    for (const FfnCut& c : p.ffn) whole_ffn += c.owner == r;
    a.push_back({{"rank", r},
                 {"weight_bytes", rank_weight_bytes(w, p, r)},
                 {"device_bytes", rank_weight_bytes(w, p, r, true)},
                 {"query_heads", range(rp.q_heads)},
                 {"kv_heads", range(rp.kv_heads)},
                 {"deltanet_key_heads", range(rp.k_heads)},
                 {"deltanet_value_heads", range(rp.v_heads)},
                 {"experts", range(rp.experts)},
                 {"vocab", range(rp.vocab)},
                 {"whole_mlps", whole_ffn}});
  }
  return {{"ranks", n}, {"kv_heads_copied", p.kv_copied}, {"deltanet_key_heads_copied", p.k_copied}, {"per_rank", a}};
}

Register reg_info("info", "Show a model's architecture, sizes, layer kinds and tensors", [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto synth = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("bf16");
  app.add_option("--model", *model, "Model directory (config.json + safetensors)");
  app.add_option("--synth", *synth, "Instead: a synth preset's shapes (" + synth_preset_list() + "), nothing drawn");
  app.add_option("--format", *format, "With --synth: bf16 | affine4 | affine8 | exl3");
  app.add_flag("--json", *json, "Print JSON");
  auto devices = std::make_shared<std::string>();
  app.add_option("--devices", *devices, "Also each rank's share when split over N devices (heads, experts, vocabulary, bytes)");
  return [=]() -> int {
    if (model->empty() == synth->empty()) fail("info: give exactly one of --model DIR or --synth PRESET");
    std::shared_ptr<ModelWeights> w;
    if (!synth->empty()) {
      SynthOptions so;
      so.preset = *synth;
      so.format = parse_synth_format(*format);
      so.shapes_only = true;
      w = synth_model(so);
    } else {
      w = ModelWeights::load(*model);
    }
    const std::string where = synth->empty() ? *model : "synth " + *synth + " " + *format;
    const auto& cfg = w->cfg;
    std::map<std::string, size_t> bytes_by_dtype;
    size_t n_tensors = 0, total = 0;
    static const std::map<std::string, const TensorInfo*> none;  // a synth model has no checkpoint
    for (auto& [name, t] : w->ckpt ? w->ckpt->tensors() : none) {
      bytes_by_dtype[dtype_name(t->dtype)] += t->nbytes;
      total += t->nbytes;
      ++n_tensors;
    }
    nlohmann::json j = cfg.to_json();
    j["model_dir"] = where;
    j["tensor_count"] = n_tensors;
    j["tensor_bytes"] = total;
    j["bytes_by_dtype"] = bytes_by_dtype;
    j["weight_bytes"] = w->weight_bytes();
    j["active_bytes_per_token"] = w->active_bytes_per_token();
    j["mtp"] = mtp_json(*w);
    if (!devices->empty()) j["devices"] = ranks_json(*w, int(parse_devices(*devices).size()));
    if (*json) {
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("model          {}\n", where);
    fmt::print("architecture   {} (model_type {})\n", arch_name(cfg.arch), cfg.model_type);
    fmt::print("layers         {} ({} Gated DeltaNet + {} gated attention)\n", cfg.layers, cfg.n_linear_layers(), cfg.n_full_layers());
    fmt::print("hidden         {}   vocab {}{}\n", cfg.hidden, cfg.vocab, cfg.tie_embeddings ? "   (tied embeddings)" : "");
    fmt::print("attention      {} q / {} kv heads x {}, rotary {}, theta {}\n", cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.rope_theta);
    fmt::print("deltanet       {} k / {} v heads, dk {} dv {}, conv {}\n", cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, cfg.lin_v_dim, cfg.conv_kernel);
    const int64_t n_moe = cfg.n_moe_layers();
    if (n_moe > 0)
      fmt::print("moe            {} experts, top-{}, expert {} / shared {} ({} layers)\n", cfg.n_experts, cfg.top_k,
                 cfg.moe_inter, cfg.shared_inter, n_moe);
    if (n_moe < cfg.layers)
      fmt::print("dense mlp      SwiGLU, intermediate {} ({} layers)\n", cfg.dense_inter, cfg.layers - n_moe);
    std::string kinds;
    for (auto k : cfg.layer_kinds) kinds += k == LayerKind::FullAttention ? 'A' : 'L';
    fmt::print("layer kinds    {}  (L = linear attention, A = full attention)\n", kinds);
    fmt::print("tensors        {} ({:.1f} MiB)\n", n_tensors, double(total) / (1 << 20));
    for (auto& [dt, b] : bytes_by_dtype) fmt::print("  {:<6} {:.1f} MiB\n", dt, double(b) / (1 << 20));
    fmt::print("active/token   {:.1f} MiB of weights\n", double(w->active_bytes_per_token()) / (1 << 20));
    const auto& m = j["mtp"];
    if (m["present"].get<bool>())
      fmt::print("mtp            1 layer ({} attention, {}), {} ({}), {:.1f} MiB, {:.1f} MiB per draft\n",
                 m["attention_format"].get<std::string>(), m["ffn"].get<std::string>(), m["prefix"].get<std::string>(),
                 m["formats"].dump(), double(w->mtp_weight_bytes()) / (1 << 20),
                 double(w->mtp_active_bytes_per_token()) / (1 << 20));
    else
      fmt::print("mtp            none ({})\n", w->mtp_absent);
    if (j.contains("devices")) {
      const auto& d = j["devices"];
      fmt::print("devices        {} ranks (KV heads {}, DeltaNet key heads {})\n", d["ranks"].get<int>(),
                 d["kv_heads_copied"].get<bool>() ? "copied" : "split", d["deltanet_key_heads_copied"].get<bool>() ? "copied" : "split");
      auto rg = [](const nlohmann::json& r) { return fmt::format("{}-{}", r[0].get<int64_t>(), r[1].get<int64_t>() - 1); };
      for (const auto& r : d["per_rank"])
        fmt::print("  rank {:<3} {:>9.1f} MiB ({:.1f} MiB on a GPU)  q heads {}  kv {}  k {}  v {}  experts {}  vocab {}{}\n",
                   r["rank"].get<int>(), double(r["weight_bytes"].get<size_t>()) / (1 << 20),
                   double(r["device_bytes"].get<size_t>()) / (1 << 20), rg(r["query_heads"]), rg(r["kv_heads"]),
                   rg(r["deltanet_key_heads"]), rg(r["deltanet_value_heads"]), rg(r["experts"]), rg(r["vocab"]),
                   r["whole_mlps"].get<int>() > 0 ? fmt::format("  whole MLPs of {} layers", r["whole_mlps"].get<int>()) : "");
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
