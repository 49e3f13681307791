// Test support: running the `lily` binary that ctest names in LILY_BIN.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace lily::test_support {

// Twelve prompt token ids as `lily` flags; every golden model's vocabulary holds them.
inline constexpr const char* kPromptTokens = "--tokens 5,17,101,33,250,7,9,81,5,17,101,33";

// `lily ARGS`: exit status; `out` gets stdout (and stderr when `err`).
inline int run_lily(const std::string& args, std::string& out, bool err = true) {
  const std::string cmd = std::string(std::getenv("LILY_BIN")) + " " + args + (err ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace lily::test_support

#define LILY_REQUIRE_BIN_OR_SKIP()                                                               \
  do {                                                                                           \
    const char* b = std::getenv("LILY_BIN");                                                     \
    if (!b || !std::filesystem::exists(b)) GTEST_SKIP() << "LILY_BIN not set (ctest sets it)";    \
  } while (0)
