// Test support: runs a shell command and returns its exit status (-1 when it did not exit normally)
// and its output (stdout + stderr).
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace lily::test_support {

inline int run_command(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace lily::test_support
