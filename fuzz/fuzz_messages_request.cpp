// A POST /v1/messages body (Anthropic) -> parse_messages_request, both as a full request and as the
// count_tokens subset -> the chat template render and tokenisation the handler does next (Qwen3 template
// and tokenizer) -> the output parser. Bad input must be a FieldError/InputError; what is accepted must
// satisfy the sampler's validation, the request limits and the shapes the template is given.
#include "fuzz_request.h"
#include "server/anthropic_messages.h"
#include "server/chat_format.h"

namespace {
std::shared_ptr<const lily::server::ChatFormat> g_chat;
std::shared_ptr<const lily::text::Tokenizer> g_tok;

void check_tools(const lily::server::MessagesRequest& r, const lily::server::RequestLimits& limits) {
  LILY_FUZZ_REQUIRE(r.tools.is_array() && r.tools.size() <= limits.tools);
  for (auto& t : r.tools) LILY_FUZZ_REQUIRE(t.is_object() && t["function"]["name"].is_string());
  if (!r.constraint.only.empty()) {
    bool found = false;
    for (auto& t : r.tools) found |= t["function"]["name"] == r.constraint.only;
    LILY_FUZZ_REQUIRE(found);
  }
}

void render(const lily::server::MessagesRequest& r) {
  const std::string prompt = g_chat->render(r.messages, r.tools, r.kwargs, true);
  for (int32_t id : g_tok->encode(prompt, true)) LILY_FUZZ_REQUIRE(id >= 0 && id < g_tok->vocab_size());
  (void)g_chat->output(prompt, r.tools);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_chat = lily::server::load_chat_format(lily::fuzz::qwen3_dir("fuzz_messages_request"), "");
  g_tok = lily::fuzz::qwen3_tokenizer("fuzz_messages_request");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lily::fuzz::check_request(data, size, [](const lily::server::json& body, const lily::server::RequestLimits& limits) {
    auto r = lily::server::parse_messages_request(body, limits, true);
    LILY_FUZZ_REQUIRE(r.messages.is_array() && r.kwargs.is_object() && r.kwargs["enable_thinking"].is_boolean());
    check_tools(r, limits);
    render(r);
  });
  return lily::fuzz::check_request(data, size, [](const lily::server::json& body, const lily::server::RequestLimits& limits) {
    auto r = lily::server::parse_messages_request(body, limits, false);
    lily::validate(r.sampling);
    LILY_FUZZ_REQUIRE(r.max_tokens && *r.max_tokens >= 1);
    LILY_FUZZ_REQUIRE(r.sampling.temperature >= 0 && r.sampling.temperature <= 1);
    LILY_FUZZ_REQUIRE(r.stops.size() <= limits.stop_strings);
    for (auto& s : r.stops) LILY_FUZZ_REQUIRE(!s.empty() && s.size() <= limits.stop_string_bytes);
    LILY_FUZZ_REQUIRE(r.max_tool_calls == 0 || r.max_tool_calls == 1);
    check_tools(r, limits);
    render(r);
  });
}
