#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "tools/synth.h"

namespace lily::cli {
namespace {

Register reg_synth("synth", "Write a random model of a real architecture (bf16, MLX affine or EXL3), for benchmarks",
             [](CLI::App& app) {
  auto preset = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("bf16");
  auto codebook = std::make_shared<std::string>("mcg");
  auto out = std::make_shared<std::string>();
  auto bits = std::make_shared<int>(4);
  auto seed = std::make_shared<uint64_t>(1);
  app.add_option("--preset", *preset, synth_preset_list())->required();
  app.add_option("--format", *format, "bf16 | affine4 | affine8 | exl3");
  app.add_option("--bits", *bits, "EXL3 bits per weight K (2..8; lm_head uses max(K, 6))");
  app.add_option("--codebook", *codebook, "EXL3 codebook: mcg | mul1 | 3inst");
  app.add_option("--out", *out, "Output directory")->required();
  app.add_option("--seed", *seed, "Random seed");
  return [=]() -> int {
    SynthOptions o;
    o.preset = *preset;
    o.format = parse_synth_format(*format);
    o.exl3_bits = *bits;
    o.codebook = parse_codebook(*codebook);
    o.seed = *seed;
    o.progress = true;
    auto r = write_synth(o, *out);
    fmt::print("wrote {} ({} {}, seed {}): {:.2f} GB in {} shards, {:.1f} s ({:.2f} GB/s)\n", *out, *preset, *format,
               *seed, double(r.bytes) / 1e9, r.shards, r.seconds, double(r.bytes) / 1e9 / std::max(r.seconds, 1e-9));
    std::vector<std::shared_ptr<void>> owned;
    const ModelConfig cfg = ModelConfig::from_json(synth_config(o), "synth:" + o.preset);
    if (cfg.n_moe_layers() == 0) return 0;  // dense: no routers
    const int64_t k = cfg.top_k;
    for (int64_t layer : {int64_t(0), cfg.layers - 1}) {
      auto spread = router_spread(synth_router(o, layer, owned), k, 2000, 7);
      fmt::print("router layer {}: top-{} over 2000 random N(0,1) inputs: {}/{} experts used, per-expert share "
                 "min {:.2f} max {:.2f} of uniform\n",
                 layer, k, spread.used, spread.experts, spread.min_share, spread.max_share);
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
