#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "core/error.h"
#include "runtime/generate.h"

namespace lily::cli {
namespace {

Register reg("generate", "Generate tokens after a prompt", [](CLI::App& app) {
  struct Opts {
    std::string model, tokens, backend = "cpu";
    int64_t max_tokens = 64, chunk = 2048, ctx = 0;
    float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, rep = 1.0f;
    int top_k = 0;
    int64_t seed = -1;
    bool json = false, ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model directory")->required();
  app.add_option("--tokens", o->tokens, "Prompt token ids, comma separated")->required();
  app.add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--top-p", o->top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  app.add_option("--min-p", o->min_p, "Drop tokens below min-p x the top probability")->capture_default_str();
  app.add_option("--repeat-penalty", o->rep, "Repetition penalty (1 = off)")->capture_default_str();
  app.add_option("--seed", o->seed, "Random seed (default: random)");
  app.add_option("--prefill-chunk", o->chunk, "Prompt tokens per forward step")->capture_default_str();
  app.add_option("--ctx-size", o->ctx, "Context size (default: prompt + max tokens)");
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's end-of-sequence ids");
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() -> int {
    auto ids = parse_ids(o->tokens, "--tokens");
    if (ids.empty()) fail("--tokens: no token ids given");
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0 (got {})", o->max_tokens);
    EngineOptions eo;
    eo.backend = o->backend;
    eo.prefill_chunk = o->chunk;
    eo.ctx_size = o->ctx > 0 ? o->ctx : int64_t(ids.size()) + o->max_tokens + 1;
    GenerateOptions go;
    go.max_tokens = o->max_tokens;
    go.sampling.temperature = o->temperature;
    go.sampling.top_k = o->top_k;
    go.sampling.top_p = o->top_p;
    go.sampling.min_p = o->min_p;
    go.sampling.repetition_penalty = o->rep;
    if (o->seed >= 0) go.sampling.seed = uint64_t(o->seed);
    validate(go.sampling);
    auto engine = Engine::open(o->model, eo);
    if (!o->ignore_eos)
      for (auto id : engine->config().eos_ids) go.stop_ids.push_back(int32_t(id));
    Session s(*engine);
    auto res = generate(s, ids, go, [&](int32_t tok, std::span<const float>) {
      if (!o->json) {
        fmt::print("{} ", tok);
        std::fflush(stdout);
      }
      return true;
    });
    const double pre = res.prefill_seconds > 0 ? double(res.prompt_tokens) / res.prefill_seconds : 0;
    const double dec = res.decode_seconds > 0 && res.tokens.size() > 1 ? double(res.tokens.size() - 1) / res.decode_seconds : 0;
    if (o->json) {
      nlohmann::json j = {{"tokens", res.tokens},
                          {"finish_reason", res.finish_reason},
                          {"prompt_tokens", res.prompt_tokens},
                          {"prefill_tokens_per_second", pre},
                          {"decode_tokens_per_second", dec}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("\n");
      fmt::print(stderr, "[{} prompt tokens, {:.1f} tok/s prefill; {} generated, {:.1f} tok/s decode; {}]\n",
                 res.prompt_tokens, pre, res.tokens.size(), dec, res.finish_reason);
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
