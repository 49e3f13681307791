// tokenizer.json text -> Tokenizer::from_json (vocab, merges, added tokens and their flags,
// normalizers, Split regexes, ByteLevel, Digits), then encode/decode of fixed texts through the
// tokenizer built: ids must be in the vocabulary and the streaming decoder must agree with decode().
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/tokenizer.h"

namespace {
const char* const kTexts[] = {
    "Hello world! 12345 <|im_start|>user\nhi<|im_end|>",
    "  spaces\t\ttabs\n\nnewlines  ",
    "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 e\xcc\x81",
    "\xff\xfe invalid \xc3",
};
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = lily::fuzz::as_text(data, size);
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return 0;
  std::shared_ptr<const lily::text::Tokenizer> tok;
  try {
    tok = lily::text::Tokenizer::from_json(j, nullptr, "tokenizer.json");
  } catch (const lily::InputError&) {
    return 0;
  }
  for (const char* s : kTexts) {
    try {
      for (bool special : {true, false}) {
        auto ids = tok->encode(s, special);
        for (int32_t id : ids) LILY_FUZZ_REQUIRE(id >= 0 && id < tok->vocab_size());
        const std::string whole = tok->decode(ids);
        lily::text::StreamDecoder sd(tok);
        std::string streamed;
        for (int32_t id : ids) streamed += sd.push(id);
        streamed += sd.flush();
        LILY_FUZZ_REQUIRE(streamed == whole);
      }
    } catch (const lily::InputError&) {
    }
  }
  return 0;
}
