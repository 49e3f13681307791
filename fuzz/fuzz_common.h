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

}  // namespace lily::fuzz
