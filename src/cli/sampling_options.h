// The sampling flags shared by the commands that sample (generate, chat): --temperature, --top-k,
// --top-p, --min-p, --repeat-penalty, --presence-penalty, --frequency-penalty, --seed. Each command
// sets its defaults in the SamplingArgs it passes.
#pragma once
#include <cstdint>

#include <CLI/CLI.hpp>

#include "runtime/sampler.h"

namespace lily::cli {

struct SamplingArgs {
  SamplingParams p;   // the defaults shown in --help
  int64_t seed = -1;  // < 0: random
};

void add_sampling_options(CLI::App& app, SamplingArgs& a);
// The parameters; InputError naming the flag for a value out of range.
SamplingParams sampling_params(const SamplingArgs& a);

}  // namespace lily::cli
