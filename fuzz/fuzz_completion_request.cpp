// A POST /v1/completions body -> parse_completion_request (a text or token-id prompt, echo, logprobs,
// the shared sampling fields) and the tokenisation of a text prompt. Bad input must be a
// FieldError/InputError; what is accepted must satisfy the sampler's validation and the limits.
#include "fuzz_request.h"
#include "server/openai_completions.h"

namespace {
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tok = lily::fuzz::qwen3_tokenizer("fuzz_completion_request");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return lily::fuzz::check_request(data, size, [](const lily::server::json& body, const lily::server::RequestLimits& limits) {
    auto r = lily::server::parse_completion_request(body, limits);
    lily::fuzz::check_sampling(r.common, limits);
    LILY_FUZZ_REQUIRE(r.logprobs >= -1);
    if (r.prompt_is_text) (void)g_tok->encode(r.prompt_text, true);
  });
}
