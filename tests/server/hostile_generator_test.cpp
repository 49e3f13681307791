// The bar of the hostile-client work: 1,000+ requests from scripts/hostile.py (mutated valid requests,
// every field with wrong types and extreme values, broken framing) against the `lily serve` binary on
// the demo model: no status >= 500, no reset or unanswered request, the server alive, and its RSS
// within 10% of its value after a warm-up round of the same mix.
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "serve_process.h"
#include "server_fixture.h"

namespace lily::server::test {
namespace {

TEST(HostileGenerator, ThousandRequestsWithoutServerErrors) {
  if (tokenizer_dir().empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  if (std::system("python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 is not installed";
  // Short deadlines keep the valid-but-long requests of the mix short; the queue holds every client
  // thread (a full queue would answer 503). The prompt cache fills during the warm-up.
  ServeProcess srv({"--parallel", "2", "--queue", "8", "--ctx-size", "1024", "--request-timeout", "1", "--read-timeout", "3",
                    "--max-tokens", "16", "--cache-mem", "32"});
  ASSERT_GT(srv.port(), 0) << srv.output();
  std::string out;
  int rc = run_command(fmt::format("python3 '{}/scripts/hostile.py' --port {} --pid {} --warmup 1200 --count 1200 --threads 4 --seed 11",
                                   LILY_SOURCE_DIR, srv.port(), srv.pid()),
                       out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("PASS"), std::string::npos) << out;
  std::printf("%s", out.c_str());
  EXPECT_TRUE(srv.alive());
  EXPECT_EQ(srv.stop(), 0) << "lily serve did not exit cleanly";
}

}  // namespace
}  // namespace lily::server::test
