#include <unistd.h>

#include <cstdio>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/registry.h"
#include "cli/sampling_options.h"
#include "core/error.h"
#include "runtime/generate.h"
#include "cli/spec_options.h"
#include "cli/text_generation.h"

namespace lily::cli {
namespace {

Register reg_generate("generate", "Generate tokens after a prompt", [](CLI::App& app) {
  struct Opts {
    std::string model, tokens, backend = "cpu", prompt, tokenizer, chat_template, system, template_kwargs;
    std::vector<std::string> cuda_opts;
    std::string devices;
    bool raw = false;
    int64_t max_tokens = 64, chunk = 0, ctx = 0;
    SamplingArgs sampling;  // greedy unless asked
    bool json = false, ignore_eos = false;
    SpecArgs spec;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model directory")->required();
  auto* tok_opt = app.add_option("--tokens", o->tokens, "Prompt token ids, comma separated");
  auto* prompt_opt = app.add_option("--prompt", o->prompt, "Prompt text (chat-formatted with the model's template unless --raw)");
  tok_opt->excludes(prompt_opt);
  app.add_flag("--raw", o->raw, "Tokenize --prompt as is, without the chat template");
  app.add_option("--tokenizer", o->tokenizer, "Directory with tokenizer.json (default: the model directory)");
  app.add_option("--chat-template", o->chat_template, "Jinja chat template file overriding the model's");
  app.add_option("--system", o->system, "System message for the chat template");
  app.add_option("--template-kwargs", o->template_kwargs, "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  app.add_option("--max-tokens", o->max_tokens, "Tokens to generate")->capture_default_str();
  add_sampling_options(app, o->sampling);
  app.add_option("--prefill-chunk", o->chunk, "Prompt tokens per forward step (0: the backend's choice, 2048 on the CPU, 8192 on CUDA)");
  app.add_option("--ctx-size", o->ctx, "Context size (default: prompt + max tokens)");
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  add_cuda_opt(app, o->cuda_opts);
  add_devices_opt(app, o->devices);
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's end-of-sequence ids");
  app.add_flag("--json", o->json, "Print one JSON object");
  add_spec_options(app, o->spec);
  return [o]() -> int {
    std::optional<TextModel> tm;
    std::vector<int32_t> ids;
    bool opens_thinking = false;
    if (!o->prompt.empty()) {
      tm = TextModel::load(o->model, o->tokenizer, o->raw ? std::string() : o->chat_template);
      std::string rendered = o->prompt;
      if (!o->raw) {
        nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
        if (!o->system.empty()) msgs.push_back({{"role", "system"}, {"content", o->system}});
        msgs.push_back({{"role", "user"}, {"content", o->prompt}});
        nlohmann::ordered_json kw = nlohmann::ordered_json::object();
        if (!o->template_kwargs.empty()) {
          kw = nlohmann::ordered_json::parse(o->template_kwargs, nullptr, false);
          if (!kw.is_object()) fail("--template-kwargs: must be a JSON object");
        }
        rendered = tm->chat_template->render(msgs, nullptr, true, kw);
        opens_thinking = text::prompt_opens_thinking(rendered);
      }
      ids = tm->tokenizer->encode(rendered);
    } else {
      if (o->tokens.empty()) fail("give --tokens or --prompt");
      ids = parse_ids(o->tokens, "--tokens");
    }
    if (ids.empty()) fail("--tokens: no token ids given");
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0 (got {})", o->max_tokens);
    EngineOptions eo;
    eo.backend = o->backend;
    eo.devices = o->devices;
    eo.prefill_chunk = o->chunk;
    eo.ctx_size = o->ctx > 0 ? o->ctx : int64_t(ids.size()) + o->max_tokens + 1;
    GenerateOptions go;
    go.max_tokens = o->max_tokens;
    go.sampling = sampling_params(o->sampling);
    auto engine = open_engine(o->model, eo, o->cuda_opts);
    go.spec = spec_params(o->spec, engine->weights());
    if (!o->ignore_eos) {
      for (auto id : engine->config().eos_ids) go.stop_ids.push_back(int32_t(id));
      if (tm)
        for (auto id : tm->tokenizer->stop_ids()) go.stop_ids.push_back(id);
    }
    if (tm && tm->tokenizer->vocab_size() > engine->config().vocab)
      fail("--tokenizer: its vocabulary ({} ids) is larger than the model's ({})", tm->tokenizer->vocab_size(),
           engine->config().vocab);
    Session s(*engine);
    GenerateResult res;
    nlohmann::json text_json;
    if (tm) {
      // Text: reasoning (dimmed on a terminal) and content, split as they stream.
      const bool tty = isatty(fileno(stdout));
      bool in_reasoning = false;
      auto turn = generate_text(s, *tm->tokenizer, ids, go, opens_thinking, [&](const text::ParsedDelta& d) {
        if (o->json) return true;
        if (!d.reasoning.empty()) {
          if (tty && !in_reasoning) fmt::print("\033[2m");
          in_reasoning = true;
          fmt::print("{}", d.reasoning);
        }
        if (!d.content.empty()) {
          if (tty && in_reasoning) fmt::print("\033[0m");
          if (in_reasoning) fmt::print("\n");
          in_reasoning = false;
          fmt::print("{}", d.content);
        }
        std::fflush(stdout);
        return true;
      });
      if (tty && in_reasoning && !o->json) fmt::print("\033[0m");
      res = turn.result;
      text_json = {{"content", turn.content}, {"reasoning", turn.reasoning}};
    } else {
      res = generate(s, ids, go, [&](int32_t id, std::span<const float>) {
        if (!o->json) {
          fmt::print("{} ", id);
          std::fflush(stdout);
        }
        return true;
      });
    }
    const double pre = res.prefill_seconds > 0 ? double(res.prompt_tokens) / res.prefill_seconds : 0;
    const double dec_tps = res.decode_seconds > 0 && res.tokens.size() > 1 ? double(res.tokens.size() - 1) / res.decode_seconds : 0;
    if (o->json) {
      nlohmann::json j = {{"tokens", res.tokens},
                          {"finish_reason", res.finish_reason},
                          {"prompt_tokens", res.prompt_tokens},
                          {"prefill_tokens_per_second", pre},
                          {"decode_tokens_per_second", dec_tps}};
      if (tm) j["text"] = text_json;
      if (go.spec.on()) j["spec"] = res.spec.to_json();
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("\n");
      fmt::print(stderr, "[{} prompt tokens, {:.1f} tok/s prefill; {} generated, {:.1f} tok/s decode; {}]\n",
                 res.prompt_tokens, pre, res.tokens.size(), dec_tps, res.finish_reason);
      if (go.spec.on())
        fmt::print(stderr, "[spec {}: {} rounds, {:.1f}% of {} drafts accepted, {:.2f} tokens per round, depth {:.2f}]\n",
                   res.spec.mode, res.spec.rounds, 100 * res.spec.acceptance(), res.spec.drafted,
                   res.spec.tokens_per_round(), res.spec.mean_depth());
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
