#include <filesystem>

#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "model/weights.h"
#include "tools/gguf_export.h"
#include "tools/synth.h"

namespace lily::cli {
namespace {

Register reg_export_gguf("export-gguf", "Write a model as a llama.cpp GGUF (qwen3next / qwen35moe)", [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto synth = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(1);
  auto out = std::make_shared<std::string>();
  auto type = std::make_shared<std::string>("bf16");
  auto quiet = std::make_shared<bool>(false);
  app.add_option("--model", *model, "Model directory (config.json + safetensors)");
  app.add_option("--synth", *synth, "Instead of --model: a random bf16 model of this preset built in memory "
                                    "(for shapes whose bf16 checkpoint would not fit on disk)");
  app.add_option("--seed", *seed, "With --synth: random seed");
  app.add_option("--out", *out, "Output .gguf file")->required();
  app.add_option("--type", *type, "Matrix type: bf16 | f32 | q8_0 | q4_0 (norms, routers, conv stay f32)");
  app.add_flag("--quiet", *quiet, "No progress on stderr");
  auto no_mtp = std::make_shared<bool>(false);
  app.add_flag("--no-mtp", *no_mtp, "Leave out the MTP block (written as layer n_layer with nextn_predict_layers 1 otherwise)");
  return [=]() -> int {
    if (model->empty() == synth->empty()) fail("export-gguf: give exactly one of --model DIR or --synth PRESET");
    GgufExportOptions opt;
    opt.type = parse_gguf_type(*type);
    opt.progress = !*quiet;
    opt.mtp = !*no_mtp;
    std::shared_ptr<ModelWeights> w;
    if (!synth->empty()) {
      SynthOptions so;
      so.preset = *synth;
      so.seed = *seed;
      so.progress = !*quiet;
      w = synth_model(so);
      opt.name = "lily synth " + *synth;
    } else {
      opt.model_dir = *model;
      opt.name = std::filesystem::path(*model).filename().string();
      if (opt.name.empty()) opt.name = std::filesystem::path(*model).parent_path().filename().string();
      w = ModelWeights::load(*model);
    }
    export_gguf(*w, *out, opt);
    if (!*quiet) fmt::print(stderr, "wrote {} ({:.1f} MiB)\n", *out, double(std::filesystem::file_size(*out)) / (1 << 20));
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
