#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <httplib.h>

#include "core/error.h"
#include "runtime/sampler.h"
#include "server/stop_filter.h"
#include "text/utf8.h"

namespace lily::server {

using json = nlohmann::ordered_json;

void OutputDelta::append(OutputDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& t : d.tool_calls) tool_calls.push_back(std::move(t));
}

namespace {

// ---- errors ----------------------------------------------------------------------------------------

struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
};

[[noreturn]] void bad(std::string param, std::string message, std::string code = "invalid_value") {
  throw ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e).dump(), "application/json");
}

// The parameter a sampler validation message starts with ("top_p must be ...").
std::string leading_word(const std::string& s) {
  size_t n = 0;
  while (n < s.size() && (std::isalnum(static_cast<unsigned char>(s[n])) || s[n] == '_')) ++n;
  return s.substr(0, n);
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

// ---- request fields --------------------------------------------------------------------------------

const json* field(const json& b, const char* k) {
  auto it = b.find(k);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const json& b, const char* k) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(k, fmt::format("'{}' must be a number", k));
  return v->get<double>();
}

std::optional<int64_t> integer(const json& b, const char* k) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15)
    return int64_t(v->get<double>());
  bad(k, fmt::format("'{}' must be an integer", k));
}

std::optional<bool> boolean(const json& b, const char* k) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(k, fmt::format("'{}' must be true or false", k));
  return v->get<bool>();
}

// Sampling fields shared by chat and completions.
struct Common {
  SamplingParams sampling;
  std::vector<std::string> stops;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<int64_t> max_tokens;
  bool stream = false, include_usage = false;
  bool cache_prompt = true;  // llama.cpp's field: false skips the prompt cache for this request
};

Common parse_common(const json& b) {
  Common c;
  c.sampling.temperature = float(number(b, "temperature").value_or(1.0));
  if (!(c.sampling.temperature >= 0 && c.sampling.temperature <= 2)) bad("temperature", "'temperature' must be between 0 and 2");
  c.sampling.top_p = float(number(b, "top_p").value_or(1.0));
  int64_t top_k = integer(b, "top_k").value_or(0);
  if (top_k < -1) bad("top_k", "'top_k' must be >= 0 (or -1 for off)");
  c.sampling.top_k = top_k < 0 ? 0 : int(std::min<int64_t>(top_k, 1 << 30));
  c.sampling.min_p = float(number(b, "min_p").value_or(0.0));
  c.sampling.presence_penalty = float(number(b, "presence_penalty").value_or(0.0));
  c.sampling.frequency_penalty = float(number(b, "frequency_penalty").value_or(0.0));
  c.sampling.repetition_penalty = float(number(b, "repetition_penalty").value_or(1.0));
  if (auto s = integer(b, "seed")) c.sampling.seed = uint64_t(*s);
  try {
    validate(c.sampling);
  } catch (const InputError& e) {
    bad(leading_word(e.what()), e.what());
  }
  if (auto* n = field(b, "n"); n && !(n->is_number_integer() && n->get<int64_t>() == 1))
    bad("n", "only n = 1 is supported");
  if (auto* s = field(b, "stop")) {
    if (s->is_string()) {
      c.stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) bad("stop", "'stop' may hold at most 16 strings");
      for (auto& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        c.stops.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    std::erase_if(c.stops, [](const std::string& x) { return x.empty(); });
  }
  if (auto* lb = field(b, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    for (auto& [k, v] : lb->items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end || id < 0 || id > INT32_MAX) bad("logit_bias", fmt::format("logit_bias key '{}' is not a token id", k));
      if (!v.is_number() || std::fabs(v.get<double>()) > 100) bad("logit_bias", "logit_bias values must be numbers in [-100, 100]");
      c.logit_bias.emplace_back(int32_t(id), float(v.get<double>()));
    }
  }
  c.max_tokens = integer(b, "max_completion_tokens");
  if (!c.max_tokens) c.max_tokens = integer(b, "max_tokens");
  else if (field(b, "max_tokens")) (void)integer(b, "max_tokens");
  if (c.max_tokens && *c.max_tokens < 1) bad(field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", "the token limit must be at least 1");
  c.stream = boolean(b, "stream").value_or(false);
  c.cache_prompt = boolean(b, "cache_prompt").value_or(true);
  if (auto* so = field(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    c.include_usage = boolean(*so, "include_usage").value_or(false);
  }
  return c;
}

// ---- events from the scheduler thread to the HTTP thread -----------------------------------------

struct LogprobItem {
  int32_t id = 0;
  std::string bytes;
  std::optional<float> lp;  // null: first prompt token
  std::vector<std::pair<int32_t, float>> top;
};

struct Event {
  enum Kind { Delta, Progress, PromptItems, Final } kind = Delta;
  OutputDelta delta;
  std::vector<LogprobItem> items;
  int64_t done = 0, total = 0;
  GenResult result;
  int reasoning_tokens = 0;
  int tool_calls = 0;
  std::vector<int32_t> ids;  // Final: every generated token id (stop ids excluded)
};

class Channel {
 public:
  void push(Event e) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  // Next event, or nothing after `timeout_ms` of silence.
  std::optional<Event> pop(int timeout_ms) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) return std::nullopt;
    Event e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

// A generation whose text goes through stop strings and (for chat) the reasoning/tool-call splitter.
class GenJob : public Job {
 public:
  GenJob(GenParams p, std::shared_ptr<const text::Tokenizer> tok, std::vector<std::string> stops,
         std::unique_ptr<OutputStream> parser, int top_logprobs, bool progress)
      : Job(std::move(p)), tok_(std::move(tok)), filter_(std::move(stops)), parser_(std::move(parser)),
        top_logprobs_(top_logprobs), progress_(progress) {}

  Channel channel;

  void on_prefill(int64_t done, int64_t total) override {
    if (!progress_) return;
    Event e;
    e.kind = Event::Progress;
    e.done = done;
    e.total = total;
    channel.push(std::move(e));
  }

  void on_prompt_logits(int64_t first, int64_t rows, std::span<const float> logits) override {
    const auto& prompt = params.prompt;
    const size_t V = logits.size() / size_t(rows);
    Event e;
    e.kind = Event::PromptItems;
    if (first == 0) e.items.push_back(item(prompt[0], std::nullopt, {}));
    for (int64_t r = 0; r < rows; ++r) {
      size_t pos = size_t(first + r) + 1;
      if (pos >= prompt.size()) break;
      auto row = logits.subspan(size_t(r) * V, V);
      e.items.push_back(item(prompt[pos], token_logprob(row, prompt[pos]), top_logprobs(row, std::max(0, top_logprobs_))));
    }
    channel.push(std::move(e));
  }

  bool on_token(int32_t t, std::span<const float> logits) override {
    std::string_view bytes;
    if (tok_ && t < tok_->vocab_size() && !tok_->is_special(t)) bytes = tok_->token_bytes(t);
    if (top_logprobs_ >= 0) {
      pending_.push_back({total_bytes_, total_bytes_ + bytes.size(),
                          item(t, token_logprob(logits, t), top_logprobs(logits, top_logprobs_))});
    }
    total_bytes_ += bytes.size();
    ids_.push_back(t);
    if (parser_ && parser_->in_reasoning()) ++reasoning_tokens_;
    Event e;
    std::string txt = filter_.push(bytes);
    if (!txt.empty()) e.delta = split(txt);
    release(e, false);
    if (!e.delta.empty() || !e.items.empty()) channel.push(std::move(e));
    return !filter_.stopped();
  }

  void on_finish(const GenResult& r) override {
    Event e;
    std::string txt = filter_.finish();
    if (!txt.empty()) e.delta = split(txt);
    if (parser_) e.delta.append(parser_->finish());
    release(e, true);
    if (!e.delta.empty() || !e.items.empty()) channel.push(std::move(e));
    Event f;
    f.kind = Event::Final;
    f.result = r;
    f.reasoning_tokens = reasoning_tokens_;
    f.tool_calls = parser_ ? parser_->tool_calls() : 0;
    f.ids = ids_;
    channel.push(std::move(f));
  }

 private:
  struct Pending {
    size_t start, end;
    LogprobItem item;
  };

  LogprobItem item(int32_t id, std::optional<float> lp, std::vector<std::pair<int32_t, float>> top) {
    LogprobItem it;
    it.id = id;
    if (tok_ && id < tok_->vocab_size()) it.bytes = tok_->token_bytes(id);
    it.lp = lp;
    it.top = std::move(top);
    return it;
  }

  OutputDelta split(const std::string& txt) {
    if (parser_) return parser_->push(txt);
    OutputDelta d;
    d.content = txt;
    return d;
  }

  // Logprob items are released with the text they produced; tokens swallowed by a stop string are not.
  void release(Event& e, bool final) {
    size_t emitted = filter_.emitted_bytes();
    while (!pending_.empty()) {
      auto& p = pending_.front();
      bool out = final ? (p.start < emitted || (p.start == p.end && p.start <= emitted && !filter_.stopped()))
                       : p.end <= emitted;
      if (!out) {
        if (final) pending_.pop_front();
        else break;
        continue;
      }
      e.items.push_back(std::move(p.item));
      pending_.pop_front();
    }
  }

  std::shared_ptr<const text::Tokenizer> tok_;
  StopFilter filter_;
  std::unique_ptr<OutputStream> parser_;
  int top_logprobs_;
  bool progress_;
  std::deque<Pending> pending_;
  size_t total_bytes_ = 0;
  int reasoning_tokens_ = 0;
  std::vector<int32_t> ids_;
};

std::string piece_text(const LogprobItem& it) { return text::utf8_sanitize(it.bytes); }

json bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

}  // namespace

// ---- the server ------------------------------------------------------------------------------------

struct Server::Impl {
  Engine& engine;
  std::shared_ptr<const text::Tokenizer> tok;
  std::shared_ptr<const ChatFormat> chat;
  ServerOptions opt;
  Scheduler* sched = nullptr;
  std::string web_dir;
  int64_t created = 0;
  std::mutex stat_mu;
  std::map<std::string, uint64_t> http_by_status;
  std::map<std::string, uint64_t> requests_by_endpoint;

  Impl(Engine& e, std::shared_ptr<const text::Tokenizer> t, std::shared_ptr<const ChatFormat> c, ServerOptions o)
      : engine(e), tok(std::move(t)), chat(std::move(c)), opt(std::move(o)) {}

  int64_t vocab() const { return engine.config().vocab; }

  std::vector<int32_t> stop_ids() const {
    std::vector<int32_t> ids;
    if (tok) ids = tok->stop_ids();
    for (auto id : engine.config().eos_ids)
      if (std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end()) ids.push_back(int32_t(id));
    std::erase_if(ids, [&](int32_t id) { return id < 0 || id >= vocab(); });
    return ids;
  }

  void count(const std::string& endpoint) {
    std::lock_guard lk(stat_mu);
    ++requests_by_endpoint[endpoint];
  }

  json parse_body(const httplib::Request& req) {
    try {
      json b = json::parse(req.body);
      if (!b.is_object()) bad("", "the request body must be a JSON object", "invalid_json");
      return b;
    } catch (const json::parse_error& e) {
      bad("", fmt::format("the request body is not valid JSON: {}", e.what()), "invalid_json");
    }
  }

  void check_model(const json& b) {
    auto* m = field(b, "model");
    if (!m) return;
    if (!m->is_string()) bad("model", "'model' must be a string");
    std::string id = m->get<std::string>();
    if (!id.empty() && id != opt.model_id)
      throw ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'", id, opt.model_id),
                     "invalid_request_error", "model", "model_not_found"};
  }

  void need_text(const char* what) {
    if (!tok) bad("", fmt::format("{} needs a tokenizer, and this model has none (serve it with --tokenizer DIR)", what), "no_tokenizer");
  }

  int64_t clip_max_tokens(const Common& c, size_t prompt) {
    int64_t room = sched->ctx_size() - int64_t(prompt);
    if (room < 1)
      bad("messages", fmt::format("the prompt has {} tokens, which does not fit the context size {}", prompt, sched->ctx_size()),
          "context_length_exceeded");
    return std::min(room, c.max_tokens.value_or(opt.default_max_tokens));
  }

  void check_prompt_ids(const std::vector<int32_t>& ids, const char* param) {
    if (ids.empty()) bad(param, "the prompt is empty");
    for (int32_t t : ids)
      if (t < 0 || t >= vocab())
        bad(param, fmt::format("prompt token id {} is outside the model's vocabulary (0..{})", t, vocab() - 1));
  }

  json usage_json(const GenResult& r, int reasoning_tokens) {
    return {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"total_tokens", r.prompt_tokens + r.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}},
            {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}}};
  }

  static json timings_json(const GenResult& r) {
    int64_t n = r.prompt_tokens - r.cached_tokens;
    auto rate = [](double n, double ms) { return ms > 0 ? n * 1e3 / ms : 0.0; };
    return {{"cache_n", r.cached_tokens},
            {"prompt_n", n},
            {"prompt_ms", r.prefill_ms},
            {"prompt_per_second", rate(double(n), r.prefill_ms)},
            {"predicted_n", r.completion_tokens},
            {"predicted_ms", r.decode_ms},
            {"predicted_per_second", rate(double(r.completion_tokens), r.decode_ms)},
            {"ttft_ms", r.ttft_ms},
            {"queue_ms", r.queue_ms}};
  }

  ApiError result_error(const GenResult& r) {
    return ApiError{r.error_is_input ? 400 : 500, r.error, r.error_is_input ? "invalid_request_error" : "server_error", "",
                    r.error_is_input ? "invalid_value" : "internal_error"};
  }

  json chat_logprob(const LogprobItem& it) {
    json top = json::array();
    for (auto [id, lp] : it.top) {
      std::string b = tok && id < tok->vocab_size() ? tok->token_bytes(id) : std::string();
      top.push_back({{"token", text::utf8_sanitize(b)}, {"logprob", lp}, {"bytes", bytes_json(b)}});
    }
    return {{"token", piece_text(it)}, {"logprob", it.lp.value_or(0.0f)}, {"bytes", bytes_json(it.bytes)}, {"top_logprobs", top}};
  }

  void submit(const std::shared_ptr<GenJob>& job) {
    if (!sched->submit(job)) {
      ApiError e{503, "The server is busy: every slot is in use and the queue is full; retry later", "server_error", "",
                 "server_busy"};
      throw e;
    }
  }

  // Streams SSE from the job's channel; a failed write cancels the job (client gone).
  template <typename OnEvent>
  void stream(httplib::Response& res, std::shared_ptr<GenJob> job, std::vector<std::string> head, OnEvent on_event) {
    int keepalive = opt.keepalive_ms;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, head = std::move(head), on_event, keepalive, sent_head = false](size_t, httplib::DataSink& sink) mutable {
          auto write = [&](const std::string& s) {
            if (!sink.write(s.data(), s.size())) {
              job->cancel();
              return false;
            }
            return true;
          };
          if (!sent_head) {
            sent_head = true;
            for (auto& h : head)
              if (!write(h)) return false;
          }
          for (;;) {
            auto ev = job->channel.pop(keepalive);
            if (!ev) {
              if (!write(": keep-alive\n\n")) return false;
              continue;
            }
            std::vector<std::string> out;
            bool final = on_event(*ev, out);
            for (auto& s : out)
              if (!write(s)) return false;
            if (final) {
              sink.done();
              return true;
            }
          }
        },
        [job](bool success) {
          if (!success) job->cancel();
        });
  }

  static std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

  // ---- /v1/chat/completions ----
  void chat_completions(const httplib::Request& req, httplib::Response& res) {
    count("chat");
    json b = parse_body(req);
    check_model(b);
    need_text("chat");
    if (!chat) bad("", "this model has no chat template (give one with --chat-template FILE)", "no_chat_template");
    Common c = parse_common(b);
    bool logprobs = boolean(b, "logprobs").value_or(false);
    bool return_tokens = boolean(b, "return_tokens").value_or(false);  // llama.cpp's field: generated ids
    int top_lp = int(integer(b, "top_logprobs").value_or(0));
    if (top_lp < 0 || top_lp > 20) bad("top_logprobs", "'top_logprobs' must be between 0 and 20");
    if (field(b, "top_logprobs") && !logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (auto* rf = field(b, "response_format")) {
      if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
        bad("response_format", "'response_format' must be an object with a 'type'");
      if ((*rf)["type"] != "text")
        bad("response_format", fmt::format("response_format type '{}' is not supported (only 'text')", (*rf)["type"].get<std::string>()));
    }

    json messages = normalize_messages(b);
    json tools = parse_tools(b);
    json kwargs = json::object();
    if (auto* k = field(b, "chat_template_kwargs")) {
      if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      kwargs = *k;
    }
    if (auto et = boolean(b, "enable_thinking"); et && !kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = *et;

    std::string prompt;
    try {
      prompt = chat->render(messages, tools, kwargs, true);
    } catch (const InputError& e) {
      bad("messages", fmt::format("the chat template failed: {}", e.what()), "template_error");
    }
    GenParams gp;
    gp.prompt = tok->encode(prompt, true);
    check_prompt_ids(gp.prompt, "messages");
    // Also save the state where the last message starts: a regenerated or edited last turn reuses it.
    if (messages.size() >= 2) {
      try {
        json head(messages.begin(), messages.end() - 1);
        auto ids = tok->encode(chat->render(head, tools, kwargs, false), true);
        if (!ids.empty() && ids.size() < gp.prompt.size() && std::equal(ids.begin(), ids.end(), gp.prompt.begin()))
          gp.boundaries.push_back(ids.size());
      } catch (const std::exception&) {
        // Some templates refuse a conversation that ends early; then there is no boundary snapshot.
      }
    }
    gp.max_tokens = clip_max_tokens(c, gp.prompt.size());
    gp.sampling = c.sampling;
    gp.logit_bias = c.logit_bias;
    gp.use_cache = c.cache_prompt;
    gp.sample_vocab = int32_t(std::min<int64_t>(tok->vocab_size(), vocab()));
    gp.stop_ids = stop_ids();
    gp.token_logits = logprobs;
    auto job = std::make_shared<GenJob>(std::move(gp), tok, c.stops, chat->output(prompt, tools),
                                        logprobs ? top_lp : -1, c.stream);
    submit(job);

    const std::string id = random_id("chatcmpl-");
    const int64_t created_at = int64_t(std::time(nullptr));
    const std::string model = opt.model_id;
    auto finish_reason = [](const Event& f) {
      std::string r = f.result.finish_reason;
      if (r == "stop" && f.tool_calls > 0) r = "tool_calls";
      return r;
    };

    if (c.stream) {
      bool include_usage = c.include_usage;
      auto chunk = [=](json delta, json logprobs_v, json finish) {
        json ch = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created_at}, {"model", model},
                   {"system_fingerprint", "lily"},
                   {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs_v)},
                                             {"finish_reason", std::move(finish)}}})}};
        if (include_usage) ch["usage"] = nullptr;
        return ch;
      };
      std::vector<std::string> head = {sse(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))};
      stream(res, job, std::move(head), [=, this](Event& ev, std::vector<std::string>& out) {
        if (ev.kind == Event::Progress) {
          out.push_back(fmt::format(": prefill {}/{}\n\n", ev.done, ev.total));
          return false;
        }
        if (ev.kind == Event::Delta) {
          json lp = nullptr;
          if (!ev.items.empty()) {
            lp = {{"content", json::array()}};
            for (auto& it : ev.items) lp["content"].push_back(chat_logprob(it));
          }
          auto& d = ev.delta;
          if (!d.reasoning.empty()) out.push_back(sse(chunk({{"reasoning_content", d.reasoning}}, nullptr, nullptr)));
          if (!d.content.empty() || (!lp.is_null() && d.tool_calls.empty()))
            out.push_back(sse(chunk({{"content", d.content}}, lp, nullptr)));
          for (auto& t : d.tool_calls) {
            json tc = {{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
            if (t.first) {
              tc["id"] = t.id;
              tc["type"] = "function";
              tc["function"]["name"] = t.name;
            }
            out.push_back(sse(chunk({{"tool_calls", json::array({tc})}}, nullptr, nullptr)));
          }
          return false;
        }
        if (ev.kind != Event::Final) return false;
        if (ev.result.finish_reason == "error") {
          out.push_back(sse(error_body(result_error(ev.result))));
        } else if (ev.result.finish_reason != "cancelled") {
          json last = chunk(json::object(), nullptr, finish_reason(ev));
          last["timings"] = timings_json(ev.result);
          out.push_back(sse(last));
          if (include_usage) {
            json u = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created_at}, {"model", model},
                      {"system_fingerprint", "lily"}, {"choices", json::array()},
                      {"usage", usage_json(ev.result, ev.reasoning_tokens)}};
            out.push_back(sse(u));
          }
        }
        out.push_back("data: [DONE]\n\n");
        return true;
      });
      return;
    }

    // Non-streaming: collect everything.
    std::string content, reasoning;
    json tool_calls = json::array();
    json lp_content = json::array();
    for (;;) {
      auto ev = job->channel.pop(3600 * 1000);
      if (!ev) continue;
      if (ev->kind == Event::Delta) {
        content += ev->delta.content;
        reasoning += ev->delta.reasoning;
        for (auto& t : ev->delta.tool_calls) {
          while (int(tool_calls.size()) <= t.index)
            tool_calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
          auto& tc = tool_calls[size_t(t.index)];
          if (t.first) {
            tc["id"] = t.id;
            tc["function"]["name"] = t.name;
          }
          tc["function"]["arguments"] = tc["function"]["arguments"].get<std::string>() + t.arguments;
        }
        for (auto& it : ev->items) lp_content.push_back(chat_logprob(it));
        continue;
      }
      if (ev->kind != Event::Final) continue;
      const auto& r = ev->result;
      if (r.finish_reason == "error") throw result_error(r);
      json msg = {{"role", "assistant"}, {"content", content}};
      if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
      if (!tool_calls.empty()) {
        msg["tool_calls"] = tool_calls;
        if (content.empty()) msg["content"] = nullptr;
      }
      json choice = {{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_reason(*ev)}};
      if (logprobs) choice["logprobs"] = {{"content", lp_content}};
      if (return_tokens) choice["tokens"] = ev->ids;
      json out = {{"id", id}, {"object", "chat.completion"}, {"created", created_at}, {"model", model},
                  {"system_fingerprint", "lily"}, {"choices", json::array({choice})},
                  {"usage", usage_json(r, ev->reasoning_tokens)}, {"timings", timings_json(r)}};
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }
  }

  json normalize_messages(const json& b) {
    auto* m = field(b, "messages");
    if (!m || !m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty array");
    json out = json::array();
    for (size_t i = 0; i < m->size(); ++i) {
      const json& x = (*m)[i];
      std::string where = fmt::format("messages[{}]", i);
      if (!x.is_object()) bad(where, where + " must be an object");
      auto* role = field(x, "role");
      if (!role || !role->is_string()) bad(where + ".role", where + " needs a string 'role'");
      std::string r = role->get<std::string>();
      if (r == "developer") r = "system";
      if (r != "system" && r != "user" && r != "assistant" && r != "tool")
        bad(where + ".role", fmt::format("{} has unknown role '{}' (system, developer, user, assistant, tool)", where, r));
      json msg = {{"role", r}};
      std::string content;
      if (auto* cnt = field(x, "content")) {
        if (cnt->is_string()) {
          content = cnt->get<std::string>();
        } else if (cnt->is_array()) {
          for (auto& part : *cnt) {
            if (part.is_string()) {
              content += part.get<std::string>();
              continue;
            }
            if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
              bad(where + ".content", where + ".content parts must be objects with a 'type'");
            std::string t = part["type"];
            if ((t == "text" || t == "input_text") && part.contains("text") && part["text"].is_string())
              content += part["text"].get<std::string>();
            else
              bad(where + ".content", fmt::format("{}: content part type '{}' is not supported (text only)", where, t));
          }
        } else {
          bad(where + ".content", where + ".content must be a string or an array of text parts");
        }
      } else if (r != "assistant") {
        bad(where + ".content", where + " needs 'content'");
      }
      msg["content"] = content;
      if (r == "assistant") {
        for (const char* k : {"reasoning_content", "reasoning"})
          if (auto* rc = field(x, k); rc && rc->is_string() && !msg.contains("reasoning_content")) msg["reasoning_content"] = *rc;
        if (auto* tcs = field(x, "tool_calls")) {
          if (!tcs->is_array()) bad(where + ".tool_calls", where + ".tool_calls must be an array");
          json calls = json::array();
          for (auto& tc : *tcs) {
            if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
                !tc["function"].contains("name") || !tc["function"]["name"].is_string())
              bad(where + ".tool_calls", where + ".tool_calls entries need function.name");
            json fn = {{"name", tc["function"]["name"]}};
            json args = tc["function"].value("arguments", json("{}"));
            if (args.is_string()) {
              try {
                fn["arguments"] = json::parse(args.get<std::string>());
              } catch (const json::parse_error&) {
                fn["arguments"] = args;
              }
            } else {
              fn["arguments"] = args;
            }
            json call = {{"type", "function"}, {"function", fn}};
            if (tc.contains("id")) call["id"] = tc["id"];
            calls.push_back(call);
          }
          if (!calls.empty()) msg["tool_calls"] = calls;
        }
      }
      if (r == "tool") {
        if (auto* id = field(x, "tool_call_id")) msg["tool_call_id"] = *id;
        if (auto* nm = field(x, "name")) msg["name"] = *nm;
      }
      out.push_back(std::move(msg));
    }
    return out;
  }

  json parse_tools(const json& b) {
    json tools = json::array();
    auto* t = field(b, "tools");
    if (t) {
      if (!t->is_array()) bad("tools", "'tools' must be an array");
      for (size_t i = 0; i < t->size(); ++i) {
        const json& x = (*t)[i];
        if (!x.is_object() || x.value("type", "function") != "function" || !x.contains("function") ||
            !x["function"].is_object() || !x["function"].contains("name") || !x["function"]["name"].is_string())
          bad(fmt::format("tools[{}]", i), fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i));
        tools.push_back(x);
      }
    }
    if (auto* tc = field(b, "tool_choice")) {
      if (tc->is_string()) {
        std::string s = *tc;
        if (s == "none") return json::array();
        if (s != "auto" && s != "required") bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
        if (s == "required" && tools.empty()) bad("tool_choice", "tool_choice 'required' needs 'tools'");
      } else if (tc->is_object()) {
        std::string name;
        if (tc->contains("function") && (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
            (*tc)["function"]["name"].is_string())
          name = (*tc)["function"]["name"];
        else
          bad("tool_choice", "a named tool_choice needs function.name");
        json one = json::array();
        for (auto& x : tools)
          if (x["function"]["name"] == name) one.push_back(x);
        if (one.empty()) bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
        return one;
      } else {
        bad("tool_choice", "'tool_choice' must be a string or an object");
      }
    }
    return tools;
  }

  // ---- /v1/completions ----
  void completions(const httplib::Request& req, httplib::Response& res) {
    count("completions");
    json b = parse_body(req);
    check_model(b);
    Common c = parse_common(b);
    auto* p = field(b, "prompt");
    if (!p) bad("prompt", "'prompt' is required");
    GenParams gp;
    std::string prompt_text;
    bool ids_given = false;
    auto from_ids = [&](const json& a) {
      for (auto& x : a) {
        if (!x.is_number_integer()) bad("prompt", "a token-id prompt must hold integers");
        int64_t v = x.get<int64_t>();
        if (v < 0 || v > INT32_MAX) bad("prompt", fmt::format("prompt token id {} is out of range", v));
        gp.prompt.push_back(int32_t(v));
      }
      ids_given = true;
    };
    if (p->is_string()) {
      need_text("a text prompt");
      prompt_text = p->get<std::string>();
      gp.prompt = tok->encode(prompt_text, true);
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
      from_ids(*p);
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      need_text("a text prompt");
      prompt_text = (*p)[0].get<std::string>();
      gp.prompt = tok->encode(prompt_text, true);
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
      from_ids((*p)[0]);
    } else {
      bad("prompt", "'prompt' must be a string, an array of token ids, or an array holding one of those");
    }
    check_prompt_ids(gp.prompt, "prompt");
    if (ids_given && tok) {
      bool decodable = std::all_of(gp.prompt.begin(), gp.prompt.end(), [&](int32_t t) { return t < tok->vocab_size(); });
      if (decodable) prompt_text = tok->decode(gp.prompt);
    }
    bool echo = boolean(b, "echo").value_or(false);
    bool return_tokens = boolean(b, "return_tokens").value_or(false);
    int lp = -1;
    if (auto* l = field(b, "logprobs")) {
      if (l->is_boolean()) lp = l->get<bool>() ? 0 : -1;
      else if (l->is_number_integer()) lp = int(l->get<int64_t>());
      else bad("logprobs", "'logprobs' must be an integer between 0 and 5");
      if (lp < -1 || lp > 20) bad("logprobs", "'logprobs' must be an integer between 0 and 20");
    }
    if (field(b, "suffix")) bad("suffix", "'suffix' is not supported");
    gp.max_tokens = clip_max_tokens(c, gp.prompt.size());
    if (!c.max_tokens) gp.max_tokens = std::min<int64_t>(gp.max_tokens, 16);  // OpenAI's default for completions
    gp.sampling = c.sampling;
    gp.logit_bias = c.logit_bias;
    gp.use_cache = c.cache_prompt;
    if (tok) gp.sample_vocab = int32_t(std::min<int64_t>(tok->vocab_size(), vocab()));
    gp.stop_ids = stop_ids();
    gp.prompt_logits = echo && lp >= 0;
    gp.token_logits = lp >= 0;
    auto job = std::make_shared<GenJob>(std::move(gp), tok, c.stops, nullptr, lp, c.stream);
    submit(job);

    const std::string id = random_id("cmpl-");
    const int64_t created_at = int64_t(std::time(nullptr));
    const std::string model = opt.model_id;
    // Legacy logprobs: parallel arrays, text_offset counted in bytes of the returned text.
    auto legacy = [this](const std::vector<LogprobItem>& items, size_t& offset) {
      json o = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
      for (auto& it : items) {
        o["tokens"].push_back(piece_text(it));
        o["token_logprobs"].push_back(it.lp ? json(*it.lp) : json(nullptr));
        if (!it.lp) {
          o["top_logprobs"].push_back(nullptr);
        } else {
          json top = json::object();
          for (auto [tid, v] : it.top) {
            std::string s = tok && tid < tok->vocab_size() ? text::utf8_sanitize(tok->token_bytes(tid)) : std::to_string(tid);
            top[s] = v;
          }
          o["top_logprobs"].push_back(top);
        }
        o["text_offset"].push_back(offset);
        offset += it.bytes.size();
      }
      return o;
    };

    if (c.stream) {
      bool include_usage = c.include_usage;
      auto chunk = [=](const std::string& text, json lpj, json finish) {
        json ch = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
                   {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(lpj)},
                                             {"finish_reason", std::move(finish)}}})}};
        if (include_usage) ch["usage"] = nullptr;
        return ch;
      };
      std::vector<std::string> head;
      auto offset = std::make_shared<size_t>(0);
      bool echo_pending = echo && lp >= 0;
      if (echo && lp < 0) {
        head.push_back(sse(chunk(prompt_text, nullptr, nullptr)));
        *offset = prompt_text.size();
      }
      stream(res, job, std::move(head), [=, this](Event& ev, std::vector<std::string>& out) mutable {
        if (ev.kind == Event::Progress) {
          out.push_back(fmt::format(": prefill {}/{}\n\n", ev.done, ev.total));
          return false;
        }
        if (ev.kind == Event::PromptItems) {
          if (echo_pending) {
            std::string t;
            for (auto& it : ev.items) t += it.bytes;
            out.push_back(sse(chunk(text::utf8_sanitize(t), legacy(ev.items, *offset), nullptr)));
          }
          return false;
        }
        if (ev.kind == Event::Delta) {
          json lpj = lp >= 0 ? legacy(ev.items, *offset) : json(nullptr);
          if (lp < 0) *offset += ev.delta.content.size();
          out.push_back(sse(chunk(ev.delta.content, lpj, nullptr)));
          return false;
        }
        if (ev.kind != Event::Final) return false;
        if (ev.result.finish_reason == "error") {
          out.push_back(sse(error_body(result_error(ev.result))));
        } else if (ev.result.finish_reason != "cancelled") {
          out.push_back(sse(chunk("", nullptr, ev.result.finish_reason)));
          if (include_usage) {
            json u = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
                      {"choices", json::array()}, {"usage", usage_json(ev.result, 0)}};
            out.push_back(sse(u));
          }
        }
        out.push_back("data: [DONE]\n\n");
        return true;
      });
      return;
    }

    std::string text_out;
    std::vector<LogprobItem> prompt_items, items;
    for (;;) {
      auto ev = job->channel.pop(3600 * 1000);
      if (!ev) continue;
      if (ev->kind == Event::PromptItems) {
        for (auto& it : ev->items) prompt_items.push_back(std::move(it));
      } else if (ev->kind == Event::Delta) {
        text_out += ev->delta.content;
        for (auto& it : ev->items) items.push_back(std::move(it));
      } else if (ev->kind == Event::Final) {
        const auto& r = ev->result;
        if (r.finish_reason == "error") throw result_error(r);
        json lpj = nullptr;
        size_t offset = 0;
        if (lp >= 0) {
          std::vector<LogprobItem> all;
          if (echo) all = prompt_items;
          all.insert(all.end(), items.begin(), items.end());
          lpj = legacy(all, offset);
        }
        std::string full = echo ? prompt_text + text_out : text_out;
        json choice = {{"index", 0}, {"text", full}, {"logprobs", lpj}, {"finish_reason", r.finish_reason}};
        if (return_tokens) choice["tokens"] = ev->ids;
        json out = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
                    {"choices", json::array({choice})}, {"usage", usage_json(r, 0)}, {"timings", timings_json(r)}};
        res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
        return;
      }
    }
  }

  // ---- small endpoints ----
  json model_json() {
    const auto& cfg = engine.config();
    return {{"id", opt.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "lily"},
            {"meta", {{"n_ctx", sched->ctx_size()}, {"n_vocab", cfg.vocab}, {"n_layers", cfg.layers},
                      {"architecture", arch_name(cfg.arch)}, {"backend", engine.backend().name()}}}};
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    count("tokenize");
    json b = parse_body(req);
    need_text("/tokenize");
    const json* c = field(b, "content");
    if (!c) c = field(b, "text");
    if (!c) c = field(b, "prompt");
    if (!c || !c->is_string()) bad("content", "'content' must be a string");
    bool special = boolean(b, "add_special").value_or(false) || boolean(b, "parse_special").value_or(true);
    auto ids = tok->encode(c->get<std::string>(), special);
    json out = {{"tokens", ids}};
    if (boolean(b, "with_pieces").value_or(false)) {
      json pieces = json::array();
      for (int32_t t : ids) pieces.push_back({{"id", t}, {"piece", text::utf8_sanitize(tok->token_bytes(t))}});
      out["tokens"] = pieces;
    }
    res.set_content(out.dump(), "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    count("detokenize");
    json b = parse_body(req);
    need_text("/detokenize");
    auto* t = field(b, "tokens");
    if (!t || !t->is_array()) bad("tokens", "'tokens' must be an array of token ids");
    std::vector<int32_t> ids;
    for (auto& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok->vocab_size())
        bad("tokens", fmt::format("'{}' is not a token id of this tokenizer (0..{})", x.dump(), tok->vocab_size() - 1));
      ids.push_back(int32_t(x.get<int64_t>()));
    }
    res.set_content(json{{"content", tok->decode(ids)}}.dump(), "application/json");
  }

  std::string metrics() {
    auto s = sched->stats();
    std::string o;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
      o += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    metric("lily_requests_submitted_total", "counter", "Generation requests accepted into the queue", s.submitted);
    metric("lily_requests_completed_total", "counter", "Generation requests that finished", s.completed);
    metric("lily_requests_cancelled_total", "counter", "Generation requests stopped because the client left", s.cancelled);
    metric("lily_requests_failed_total", "counter", "Generation requests that ended with an error", s.failed);
    metric("lily_requests_rejected_total", "counter", "Requests refused with 503 (queue full)", s.rejected);
    metric("lily_prompt_tokens_total", "counter", "Prompt tokens of finished requests", s.prompt_tokens);
    metric("lily_prefilled_tokens_total", "counter", "Prompt tokens run through the model (not from the cache)", s.prefilled_tokens);
    metric("lily_cached_tokens_total", "counter", "Prompt tokens restored from the prompt cache", s.cached_tokens);
    metric("lily_generated_tokens_total", "counter", "Tokens generated", s.generated_tokens);
    metric("lily_prefill_seconds_total", "counter", "Seconds spent in prefill", s.prefill_seconds);
    metric("lily_decode_seconds_total", "counter", "Seconds spent in decode steps", s.decode_seconds);
    metric("lily_prefill_tokens_per_second", "gauge", "Prefill throughput over all requests",
           s.prefill_seconds > 0 ? double(s.prefilled_tokens) / s.prefill_seconds : 0.0);
    metric("lily_decode_tokens_per_second", "gauge", "Decode throughput over all requests",
           s.decode_seconds > 0 ? double(s.generated_tokens) / s.decode_seconds : 0.0);
    metric("lily_requests_active", "gauge", "Requests holding a slot", s.active);
    metric("lily_queue_depth", "gauge", "Requests waiting for a slot", s.queued);
    metric("lily_prompt_cache_hits_total", "counter", "Prompt cache lookups that found a prefix", s.cache.hits);
    metric("lily_prompt_cache_misses_total", "counter", "Prompt cache lookups that found nothing", s.cache.misses);
    metric("lily_prompt_cache_evictions_total", "counter", "Prompt cache entries evicted", s.cache.evictions);
    metric("lily_prompt_cache_entries", "gauge", "Prompt cache entries", s.cache.entries);
    metric("lily_prompt_cache_bytes", "gauge", "Prompt cache memory", s.cache.bytes);
    {
      std::lock_guard lk(stat_mu);
      o += "# HELP lily_http_requests_total HTTP requests by endpoint\n# TYPE lily_http_requests_total counter\n";
      for (auto& [k, v] : requests_by_endpoint) o += fmt::format("lily_http_requests_total{{endpoint=\"{}\"}} {}\n", k, v);
      o += "# HELP lily_http_responses_total HTTP responses by status\n# TYPE lily_http_responses_total counter\n";
      for (auto& [k, v] : http_by_status) o += fmt::format("lily_http_responses_total{{status=\"{}\"}} {}\n", k, v);
    }
    return o;
  }
};

namespace {

std::string find_web_dir(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!given.empty()) return given;
  std::vector<fs::path> starts;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  starts.push_back(fs::current_path(ec));
  for (auto d : starts)
    for (int up = 0; up < 5 && !d.empty(); ++up) {
      if (fs::is_regular_file(d / "web" / "index.html", ec)) return (d / "web").string();
      if (d == d.parent_path()) break;
      d = d.parent_path();
    }
  return "";
}

}  // namespace

Server::Server(Engine& engine, std::shared_ptr<const text::Tokenizer> tok, std::shared_ptr<const ChatFormat> chat,
               ServerOptions opt)
    : impl_(std::make_unique<Impl>(engine, std::move(tok), std::move(chat), std::move(opt))) {
  auto& I = *impl_;
  sched_ = std::make_unique<Scheduler>(engine, I.opt.sched);
  I.sched = sched_.get();
  I.created = int64_t(std::time(nullptr));
  I.web_dir = find_web_dir(I.opt.web_dir);
  http_ = std::make_unique<httplib::Server>();
  auto& h = *http_;
  const size_t threads = size_t(std::max(16, I.opt.sched.parallel + I.opt.sched.max_queue + 8));
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_payload_max_length(I.opt.max_body_bytes);
  h.set_keep_alive_timeout(30);
  h.set_read_timeout(60);
  h.set_write_timeout(30);
  h.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  if (!I.web_dir.empty()) h.set_mount_point("/", I.web_dir);

  // Every handler answers errors with an OpenAI envelope; nothing a client sends escapes as an exception.
  auto wrap = [this](void (Impl::*fn)(const httplib::Request&, httplib::Response&)) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        (impl_.get()->*fn)(req, res);
      } catch (const ApiError& e) {
        if (e.status == 503) res.set_header("Retry-After", std::to_string(sched_->retry_after_seconds()));
        send_error(res, e);
      } catch (const InputError& e) {
        send_error(res, ApiError{400, e.what(), "invalid_request_error", "", "invalid_value"});
      } catch (const std::exception& e) {
        send_error(res, ApiError{500, fmt::format("internal error: {}", e.what()), "server_error", "", "internal_error"});
      }
    };
  };
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    const auto& key = impl_->opt.api_key;
    // Open without a key: /health and the chat page's static files.
    bool open = req.path == "/health" ||
                (req.method == "GET" && req.path.rfind("/v1", 0) != 0 && req.path != "/metrics");
    if (key.empty() || open) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    std::string xkey = req.get_header_value("x-api-key");
    if (auth == "Bearer " + key || xkey == key) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError{401, "Incorrect or missing API key (send 'Authorization: Bearer KEY')", "authentication_error",
                             "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  h.Post("/v1/chat/completions", wrap(&Impl::chat_completions));
  h.Post("/chat/completions", wrap(&Impl::chat_completions));
  h.Post("/v1/completions", wrap(&Impl::completions));
  h.Post("/completions", wrap(&Impl::completions));
  h.Post("/tokenize", wrap(&Impl::tokenize));
  h.Post("/detokenize", wrap(&Impl::detokenize));
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    impl_->count("models");
    res.set_content(json{{"object", "list"}, {"data", json::array({impl_->model_json()})}}.dump(), "application/json");
  });
  h.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->count("models");
    if (req.matches[1] != impl_->opt.model_id) {
      send_error(res, ApiError{404, fmt::format("The model '{}' does not exist", req.matches[1].str()), "invalid_request_error",
                               "model", "model_not_found"});
      return;
    }
    res.set_content(impl_->model_json().dump(), "application/json");
  });
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    auto s = sched_->stats();
    res.set_content(json{{"status", "ok"}, {"slots_active", s.active}, {"queue", s.queued}}.dump(), "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(impl_->metrics(), "text/plain; version=0.0.4");
  });
  h.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    if (res.status == 404) {
      e.message = fmt::format("Unknown route: {} {}", req.method, req.path);
      e.code = "not_found";
    } else if (res.status == 413) {
      e.message = "The request body is too large";
      e.code = "request_too_large";
    } else if (res.status == 400) {
      e.message = "Malformed HTTP request";
    } else {
      e.message = fmt::format("HTTP error {}", res.status);
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    }
    res.set_content(error_body(e).dump(), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard lk(impl_->stat_mu);
    ++impl_->http_by_status[std::to_string(res.status)];
  });
}

Server::~Server() { stop(); }

int Server::bind() {
  const auto& o = impl_->opt;
  if (o.port == 0) {
    port_ = http_->bind_to_any_port(o.host);
  } else {
    port_ = http_->bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (port_ <= 0) fail("cannot listen on {}:{} (address in use, or not a local address)", o.host, o.port);
  return port_;
}

void Server::listen() { http_->listen_after_bind(); }

void Server::start() {
  bind();
  thread_ = std::thread([this] { listen(); });
  for (int i = 0; i < 500 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void Server::stop() {
  // Generation ends first, so that streams close and the HTTP threads are free to finish.
  if (sched_) sched_->stop();
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lily::server
