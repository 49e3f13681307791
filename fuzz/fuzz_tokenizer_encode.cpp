// Text -> the real Qwen3 tokenizer (fetched by scripts/fetch-assets.sh): encode with and without
// special tokens, decode, stream-decode. Ids are in the vocabulary, the streaming decoder equals
// decode(), and text that is valid NFC UTF-8 comes back byte for byte.
#include "fuzz_common.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {
std::shared_ptr<const lily::text::Tokenizer> g_tok;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tok = lily::fuzz::qwen3_tokenizer("fuzz_tokenizer_encode");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s = lily::fuzz::as_text(data, size);
  const bool nfc_text = lily::text::utf8_valid(s) && lily::text::nfc(s) == s;
  for (bool special : {true, false}) {
    auto ids = g_tok->encode(s, special);
    for (int32_t id : ids) LILY_FUZZ_REQUIRE(id >= 0 && id < g_tok->vocab_size());
    const std::string whole = g_tok->decode(ids);
    LILY_FUZZ_REQUIRE(lily::text::utf8_valid(whole));
    if (nfc_text) LILY_FUZZ_REQUIRE(whole == s);
    for (bool skip : {false, true}) {
      lily::text::StreamDecoder sd(g_tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += sd.push(id);
      streamed += sd.flush();
      LILY_FUZZ_REQUIRE(streamed == g_tok->decode(ids, skip));
    }
  }
  return 0;
}
