#include "cli/sampling_options.h"

#include "core/error.h"

namespace lily::cli {

void add_sampling_options(CLI::App& app, SamplingArgs& a) {
  app.add_option("--temperature", a.p.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", a.p.top_k, "Keep the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--top-p", a.p.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  app.add_option("--min-p", a.p.min_p, "Drop tokens below min-p x the top probability")->capture_default_str();
  app.add_option("--repeat-penalty", a.p.repetition_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  app.add_option("--presence-penalty", a.p.presence_penalty, "Subtracted once from every seen token's logit, -2..2")
      ->capture_default_str();
  app.add_option("--frequency-penalty", a.p.frequency_penalty, "Subtracted per occurrence of a seen token, -2..2")
      ->capture_default_str();
  app.add_option("--seed", a.seed, "Random seed (default: random)");
}

SamplingParams sampling_params(const SamplingArgs& a) {
  SamplingParams p = a.p;
  if (a.seed >= 0) p.seed = uint64_t(a.seed);
  try {
    validate(p);
  } catch (const InputError& e) {
    // validate() names the API field (top_p); the user typed the flag (--top-p)
    std::string m = e.what();
    const size_t sp = m.find(' ');
    std::string field = m.substr(0, sp);
    for (char& c : field)
      if (c == '_') c = '-';
    if (field == "repetition-penalty") field = "repeat-penalty";
    fail("--{}{}", field, sp == std::string::npos ? "" : m.substr(sp));
  }
  return p;
}

}  // namespace lily::cli
