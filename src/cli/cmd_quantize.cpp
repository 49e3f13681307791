#include <fmt/format.h>

#include "cli/registry.h"
#include "tools/quantize.h"

namespace lily::cli {
namespace {

Register reg_quantize("quantize", "Quantize a float checkpoint to MLX affine or EXL3", [](CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  app.add_option("--model", o->model_dir, "Input model directory (config.json + float safetensors)")->required();
  app.add_option("--out", o->out_dir, "Output directory")->required();
  app.add_option("--format", o->format, "affine | exl3")->required();
  app.add_option("--bits", o->bits, "affine: 2, 3, 4, 5, 6, 8; exl3: 1..8, fractional = per-tensor K mix");
  app.add_option("--group-size", o->group_size, "affine group size: 32, 64, 128");
  app.add_option("--codebook", o->codebook, "exl3 codebook: mcg | mul1 | 3inst");
  app.add_option("--head-bits", o->head_bits, "exl3 lm_head bits (16 = keep unquantized)");
  app.add_option("--calibration", o->calibration, "exl3: token-id file; Hessians from it drive LDLQ");
  app.add_option("--calibration-tokens", o->calibration_tokens, "exl3: calibration tokens used at most");
  app.add_flag("--keep-mtp", o->keep_mtp, "Leave the MTP block (mtp.*) unquantized (bf16 as stored)");
  return [=]() -> int {
    auto r = quantize_model(*o);
    fmt::print("wrote {}: {} matrices quantized ({} {:.2f} bits/weight incl. scales), {:.1f} MB", o->out_dir,
               r.tensors_quantized, o->format, r.bits_per_weight, double(r.bytes_written) / 1e6);
    if (r.tiles > 0)
      fmt::print(", {} tiles in {:.1f} s ({:.1f} tiles/s), mean proxy error {:.5f}", r.tiles, r.seconds,
                 double(r.tiles) / std::max(r.seconds, 1e-9), r.proxy_err_mean);
    fmt::print("\n");
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
