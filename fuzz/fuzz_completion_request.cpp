// A POST /v1/completions body -> parse_completion_request (a text or token-id prompt, echo, logprobs,
// the shared sampling fields) and the tokenisation of a text prompt. Bad input must be a
// FieldError/InputError; what is accepted must satisfy the sampler's validation and the limits.
#include "fuzz_request.h"
#include "server/openai_completions.h"

namespace {
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto dir = lily::fuzz::qwen3_dir("fuzz_completion_request");
  g_tok = lily::text::Tokenizer::load(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto body = lily::fuzz::request_body(data, size);
  if (!body) return 0;
  const lily::server::RequestLimits limits;
  try {
    auto r = lily::server::parse_completion_request(*body, limits);
    lily::fuzz::check_sampling(r.common, limits);
    LILY_FUZZ_REQUIRE(r.logprobs >= -1);
    if (r.prompt_is_text) (void)g_tok->encode(r.prompt_text, true);
  } catch (const lily::InputError&) {
  }
  return 0;
}
