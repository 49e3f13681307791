// `--spec mtp|ngram|off` and `--spec-depth N|auto`, shared by the commands that generate (generate,
// chat, serve, bench).
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "model/weights.h"
#include "runtime/spec.h"

namespace lily::cli {

struct SpecArgs {
  std::string mode = "off", depth = "auto";
  float typical = 0.0f;
  int draft_vocab = 0;
};

void add_spec_options(CLI::App& app, SpecArgs& a);
// The parameters (InputError naming the flag for a bad value; `--spec mtp` on a model without the MTP
// block: InputError naming the missing tensors).
SpecParams spec_params(const SpecArgs& a, const ModelWeights& w);

}  // namespace lily::cli
