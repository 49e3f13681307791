// Sequence state: snapshot/restore reproduces the exact continuation; decode == prefill.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "runtime/session.h"
#include "test_util.h"

using namespace lily;

namespace {

TEST(State, SnapshotRestoreGivesIdenticalLogits) {
  for (const char* name : {"qwen3_5_moe_text-a", "qwen3_next-a"}) {
    auto dir = test::golden_dir(name);
    auto ids = nlohmann::json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
    EngineOptions eo;
    eo.ctx_size = 256;
    eo.prefill_chunk = 32;
    auto e = Engine::open(dir, eo);
    const size_t V = size_t(e->config().vocab);
    Session s(*e);
    std::vector<int32_t> head(ids.begin(), ids.begin() + 100), tail(ids.begin() + 100, ids.begin() + 120);
    s.prefill(head, nullptr);
    Snapshot snap = s.snapshot();
    EXPECT_EQ(snap.tokens.size(), 100u);
    EXPECT_GT(snap.nbytes(), 0u);
    std::vector<float> a(tail.size() * V), b(tail.size() * V);
    s.prefill(tail, nullptr, a.data());
    s.restore(snap);
    EXPECT_EQ(s.n_tokens(), 100);
    // Same continuation token by token (recurrent path) after restoring.
    for (size_t i = 0; i < tail.size(); ++i) s.decode(tail[i], b.data() + i * V);
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    EXPECT_LE(m, 1e-4) << name;
    // reset() forgets everything.
    s.reset();
    EXPECT_EQ(s.n_tokens(), 0);
    std::vector<float> c(head.size() * V), d(head.size() * V);
    s.prefill(head, nullptr, c.data());
    Session fresh(*e);
    fresh.prefill(head, nullptr, d.data());
    EXPECT_EQ(c, d) << name;
  }
}

}  // namespace
