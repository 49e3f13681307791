// `lily serve` as a child process for the tests that need the real binary: started with the given
// flags on a free port (read back from its "listening on" line), stopped with SIGTERM.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "../support/run_command.h"

namespace lily::server::test {

using test_support::run_command;

inline std::string lily_binary() {
  const char* bin = std::getenv("LILY_BIN");
  return bin ? bin : std::string(LILY_BINARY_DIR) + "/lily";
}

class ServeProcess {
 public:
  // Starts `lily serve --port 0 ARGS...`; port() is 0 when it did not come up (output() says why).
  explicit ServeProcess(const std::vector<std::string>& args) {
    std::string lily = lily_binary();
    if (!std::filesystem::exists(lily)) return;
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      std::vector<std::string> all = {lily, "serve", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(lily.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
    std::regex re(R"(listening on http://[^:]+:(\d+))");
    char buf[512];
    for (int i = 0; i < 400 && port_ == 0; ++i) {
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;
      out_.append(buf, size_t(n));
      std::smatch m;
      if (std::regex_search(out_, m, re)) port_ = std::stoi(m[1]);
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && !stopped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return out_; }
  bool alive() const { return pid_ > 0 && !stopped_ && kill(pid_, 0) == 0; }
  // SIGTERM; returns the exit status (-1 when killed by a signal).
  int stop() {
    if (pid_ <= 0 || stopped_) return -1;
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    stopped_ = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  bool stopped_ = false;
  std::string out_;
};

}  // namespace lily::server::test
