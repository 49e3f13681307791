// A POST /v1/chat/completions body -> parse_chat_request (sampling fields, stop, logit_bias, messages,
// tools, tool_choice, template kwargs) -> the chat template render and tokenisation the handler does
// next (Qwen3 template and tokenizer). Bad input must be a FieldError/InputError; what is accepted must
// satisfy the sampler's own validation and the request limits.
#include "fuzz_request.h"
#include "server/chat_format.h"
#include "server/openai_chat.h"

namespace {
std::shared_ptr<const lily::server::ChatFormat> g_chat;
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_chat = lily::server::load_chat_format(lily::fuzz::qwen3_dir("fuzz_chat_request"), "");
  g_tok = lily::fuzz::qwen3_tokenizer("fuzz_chat_request");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return lily::fuzz::check_request(data, size, [](const lily::server::json& body, const lily::server::RequestLimits& limits) {
    auto cr = lily::server::parse_chat_request(body, limits);
    lily::fuzz::check_sampling(cr.common, limits);
    LILY_FUZZ_REQUIRE(cr.messages.is_array() && !cr.messages.empty() && cr.kwargs.is_object());
    LILY_FUZZ_REQUIRE(cr.top_logprobs >= 0 && cr.top_logprobs <= 20);
    const std::string prompt = g_chat->render(cr.messages, cr.tools, cr.kwargs, true);
    auto ids = g_tok->encode(prompt, true);
    for (int32_t id : ids) LILY_FUZZ_REQUIRE(id >= 0 && id < g_tok->vocab_size());
    (void)g_chat->output(prompt, cr.tools);
  });
}
