#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "tools/bench.h"
#include "tools/synth.h"

namespace lily::cli {
namespace {

Register reg("bench", "Prefill and decode speed (tok/s, fraction of the memory roofline, peak memory)", [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto synth = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("bf16");
  auto codebook = std::make_shared<std::string>("mcg");
  auto bits = std::make_shared<int>(4);
  auto seed = std::make_shared<uint64_t>(1);
  auto backend = std::make_shared<std::string>("cpu");
  auto prefill = std::make_shared<std::string>("256,1024");
  auto decode = std::make_shared<std::string>("256");
  auto opt = std::make_shared<BenchOptions>();
  auto json = std::make_shared<bool>(false);
  app.add_option("--model", *model, "Model directory");
  app.add_option("--synth", *synth, "Build a random model of this preset in memory instead (qwen3.5-35b-a3b | qwen3-next-80b-a3b | small | tiny)");
  app.add_option("--format", *format, "With --synth: bf16 | affine4 | affine8 | exl3");
  app.add_option("--bits", *bits, "With --synth --format exl3: K");
  app.add_option("--codebook", *codebook, "With --synth --format exl3: mcg | mul1 | 3inst");
  app.add_option("--seed", *seed, "With --synth: random seed");
  app.add_option("--backend", *backend, "cpu | cuda");
  app.add_option("--prefill", *prefill, "Prompt lengths, comma separated (k = 1024)");
  app.add_option("--decode-context", *decode, "Context lengths for decode, comma separated");
  app.add_option("--repeats", opt->repeats, "Timed runs per figure (median reported)");
  app.add_option("--decode-tokens", opt->decode_tokens, "Single-token steps per decode run");
  app.add_option("--prefill-chunk", opt->prefill_chunk, "Tokens per prefill step, also the context fill (0: the backend's choice, 2048 on the CPU, 8192 on CUDA)");
  app.add_flag("--json", *json, "Print JSON on stdout");
  return [=]() -> int {
    if (model->empty() == synth->empty()) fail("bench: give exactly one of --model DIR or --synth PRESET");
    BenchOptions o = *opt;
    o.backend = *backend;
    o.prefill = parse_sizes(*prefill, "--prefill");
    o.decode_context = parse_sizes(*decode, "--decode-context");
    std::shared_ptr<const ModelWeights> w;
    if (!synth->empty()) {
      SynthOptions so;
      so.preset = *synth;
      so.format = parse_synth_format(*format);
      so.exl3_bits = *bits;
      so.codebook = parse_codebook(*codebook);
      so.seed = *seed;
      so.progress = true;
      o.label = fmt::format("synth {} {}", *synth, *format);
      w = synth_model(so);
    } else {
      o.label = *model;
      w = ModelWeights::load(*model);
    }
    auto rep = run_bench(w, o);
    if (*json) fmt::print("{}\n", rep.to_json().dump(2));
    else fmt::print("{}", rep.table());
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
