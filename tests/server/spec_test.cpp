// Speculative decoding behind the server: the per-request `spec` / `spec_depth` fields (and the server's
// default) give the tokens of plain decoding, the reply's timings carry the draft counts, /metrics the
// acceptance; bad values are 400s in the API's envelope naming the field.
#include <fstream>

#include "server_fixture.h"

namespace lily::server::test {
namespace {

std::unique_ptr<Running> spec_server(const std::string& name, SpecParams spec = {}) {
  ServerOptions so;
  so.model_id = name;
  so.spec = spec;
  so.sched.parallel = 2;
  return start_server(ModelWeights::load(golden_dir(name)), nullptr, "", so, 512, 64);
}

std::vector<int> prompt_of(const std::string& name) {
  std::ifstream f(golden_dir(name) + "/golden.json");
  auto g = json::parse(f);
  return std::vector<int>(g["prompt_ids"].begin(), g["prompt_ids"].begin() + 40);
}

TEST(ServerSpec, RequestFieldsTimingsAndMetrics) {
  const std::string name = "qwen3_5_moe_text-a-mtp";
  auto srv = spec_server(name);
  json body = {{"prompt", prompt_of(name)}, {"max_tokens", 16}, {"temperature", 0}, {"return_tokens", true}, {"cache_prompt", false}};
  int st = 0;
  json plain = post_json(srv->port(), "/v1/completions", body, &st);
  ASSERT_EQ(st, 200) << plain.dump();
  EXPECT_FALSE(plain["timings"].contains("draft_n"));
  for (json extra : {json{{"spec", "mtp"}, {"spec_depth", 3}}, json{{"spec", "ngram"}, {"spec_depth", "auto"}}, json{{"spec", "mtp"}}}) {
    json b = body;
    for (auto& [k, v] : extra.items()) b[k] = v;
    json r = post_json(srv->port(), "/v1/completions", b, &st);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["tokens"], plain["choices"][0]["tokens"]) << extra.dump();
    ASSERT_TRUE(r["timings"].contains("spec")) << r.dump();
    EXPECT_EQ(r["timings"]["spec"]["mode"], extra["spec"]);
    EXPECT_TRUE(r["timings"]["draft_n"].is_number());
    EXPECT_TRUE(r["timings"]["spec"]["acceptance_per_position"].is_array());
  }
  // streaming, chat-style final usage aside: the same text
  json sb = body;
  sb["spec"] = "mtp";
  sb["stream"] = true;
  auto s = post_sse(srv->port(), "/v1/completions", sb);
  EXPECT_TRUE(s.done);
  auto c = client(srv->port());
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("lily_spec_rounds_total "), std::string::npos);
  EXPECT_EQ(m->body.find("lily_spec_rounds_total 0\n"), std::string::npos) << "rounds were counted";
  EXPECT_NE(m->body.find("lily_spec_acceptance{position=\"1\"}"), std::string::npos);
}

TEST(ServerSpec, ServerDefaultAndRequestOverride) {
  const std::string name = "qwen3_next-a-mtp";
  SpecParams def;
  def.mode = SpecMode::Mtp;
  def.depth = 2;
  auto srv = spec_server(name, def);
  json body = {{"prompt", prompt_of(name)}, {"max_tokens", 10}, {"temperature", 0}, {"return_tokens", true}};
  json r = post_json(srv->port(), "/v1/completions", body);
  EXPECT_EQ(r["timings"]["spec"]["mode"], "mtp");
  body["spec"] = "off";
  json off = post_json(srv->port(), "/v1/completions", body);
  EXPECT_FALSE(off["timings"].contains("spec"));
  EXPECT_EQ(off["choices"][0]["tokens"], r["choices"][0]["tokens"]);
}

TEST(ServerSpec, BadValuesAre400sNamingTheField) {
  auto srv = spec_server("qwen3_next-a");  // no MTP block
  auto expect_400 = [&](const json& extra, const std::string& param, const std::string& says) {
    json b = {{"prompt", {1, 2, 3}}, {"max_tokens", 2}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    int st = 0;
    json r = post_json(srv->port(), "/v1/completions", b, &st);
    EXPECT_EQ(st, 400) << r.dump();
    ASSERT_TRUE(r.contains("error")) << r.dump();
    EXPECT_EQ(r["error"]["param"], param) << r.dump();
    EXPECT_EQ(r["error"]["type"], "invalid_request_error");
    EXPECT_NE(r["error"]["message"].get<std::string>().find(says), std::string::npos) << r.dump();
  };
  expect_400({{"spec", "eagle"}}, "spec", "eagle");
  expect_400({{"spec", 3}}, "spec", "spec");
  expect_400({{"spec_depth", 0}}, "spec_depth", "1..16");
  expect_400({{"spec_depth", 17}}, "spec_depth", "1..16");
  expect_400({{"spec_depth", "deep"}}, "spec_depth", "auto");
  expect_400({{"spec", "mtp"}}, "spec", "mtp.fc.weight");
  auto h = client(srv->port()).Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

}  // namespace
}  // namespace lily::server::test
