// A POST /v1/responses body (OpenAI Responses) -> parse_responses_request -> the conversation the handler
// builds (instructions as a system message, then the input items) -> the chat template render and
// tokenisation (Qwen3 template and tokenizer) -> the output parser. Bad input must be a
// FieldError/InputError; what is accepted must satisfy the sampler's validation, the request limits and
// the shapes the template is given.
#include "fuzz_request.h"
#include "server/chat_format.h"
#include "server/openai_responses.h"

namespace {
std::shared_ptr<const lily::server::ChatFormat> g_chat;
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_chat = lily::server::load_chat_format(lily::fuzz::qwen3_dir("fuzz_responses_request"), "");
  g_tok = lily::fuzz::qwen3_tokenizer("fuzz_responses_request");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lily::server::json;
  return lily::fuzz::check_request(data, size, [](const json& body, const lily::server::RequestLimits& limits) {
    auto r = lily::server::parse_responses_request(body, limits);
    lily::validate(r.sampling);
    LILY_FUZZ_REQUIRE(r.sampling.temperature >= 0 && r.sampling.temperature <= 2);
    LILY_FUZZ_REQUIRE(!r.max_output_tokens || *r.max_output_tokens >= 1);
    LILY_FUZZ_REQUIRE(r.input.is_array() && r.kwargs.is_object() && r.metadata.is_object());
    LILY_FUZZ_REQUIRE(r.tools.is_array() && r.tools.size() <= limits.tools && r.tools_echo.is_array());
    for (auto& t : r.tools) LILY_FUZZ_REQUIRE(t["function"]["name"].is_string());
    if (r.constraint.kind == lily::server::OutputConstraint::ToolCall) LILY_FUZZ_REQUIRE(!r.tools.empty());
    json messages = json::array();
    if (r.has_instructions) messages.push_back({{"role", "system"}, {"content", r.instructions}});
    for (auto& m : r.input) messages.push_back(m);
    const std::string prompt = g_chat->render(messages, r.tools, r.kwargs, true);
    for (int32_t id : g_tok->encode(prompt, true)) LILY_FUZZ_REQUIRE(id >= 0 && id < g_tok->vocab_size());
    (void)g_chat->output(prompt, r.tools);
  });
}
