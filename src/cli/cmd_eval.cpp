#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/registry.h"
#include "tools/calibrate.h"
#include "tools/eval.h"

namespace lily::cli {
namespace {

Register reg_eval("eval", "Teacher-forced fidelity of a model against a reference: perplexities, KL, top-1 agreement",
             [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto ref = std::make_shared<std::string>();
  auto tokens = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto opt = std::make_shared<EvalOptions>();
  app.add_option("--model", *model, "Model directory to evaluate")->required();
  app.add_option("--reference", *ref, "Reference model directory (same tokenizer/vocabulary)")->required();
  app.add_option("--tokens-file", *tokens, "Token ids separated by commas or white space")->required();
  app.add_option("--backend", opt->backend, "cpu | cuda");
  app.add_option("--chunk", opt->chunk, "Tokens per teacher-forced step");
  add_devices_opt(app, opt->devices);
  app.add_flag("--json", *json, "Print JSON");
  return [=]() -> int {
    auto ids = read_token_file(*tokens);
    auto r = eval_models(*model, *ref, ids, *opt);
    if (*json) {
      nlohmann::json j = {{"positions", r.positions},   {"ppl_model", r.ppl_model}, {"ppl_reference", r.ppl_reference},
                          {"kl_mean", r.kl_mean},        {"kl_p99", r.kl_p99},       {"top1_agreement", r.top1_agreement}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("positions       {}\n", r.positions);
    fmt::print("ppl model       {:.4f}\n", r.ppl_model);
    fmt::print("ppl reference   {:.4f}\n", r.ppl_reference);
    fmt::print("KL mean         {:.6f} nats\n", r.kl_mean);
    fmt::print("KL p99          {:.6f} nats\n", r.kl_p99);
    fmt::print("top-1 agreement {:.4f}\n", r.top1_agreement);
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
