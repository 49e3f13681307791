// `--cuda-opt name=value` (repeatable) and `--precision` of the commands that take --backend: CUDA backend options by name
// (backend/cuda/cuda_backend.h: set_cuda_option), `--cpu-opt name=value` the CPU backend's (backend/cpu/cpu_backend.h:
// set_cpu_option), and the engines built with them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend.h"
#include "runtime/engine.h"

namespace lily::cli {

// --cuda-opt name=value (repeatable) and --precision bf16|high (appended to dst as precision=...).
void add_cuda_opt(CLI::App& app, std::vector<std::string>& dst);
// --cpu-opt name=value (repeatable).
void add_cpu_opt(CLI::App& app, std::vector<std::string>& dst);
// --devices N | a,b,... (EngineOptions::devices).
void add_devices_opt(CLI::App& app, std::string& dst);
// Throws InputError when CUDA options were given for another backend.
void require_cuda_backend(const std::vector<std::string>& cuda_opts, const std::string& backend);
// The CUDA backend for `w` with the options (throws InputError for an unknown option, a bad value, or a
// build without CUDA), over the ranks of `devices` when given (EngineOptions::devices).
std::unique_ptr<Backend> make_backend_with(std::shared_ptr<const ModelWeights> w, const std::vector<std::string>& cuda_opts,
                                           const std::string& devices = "");
// Engine::open / Engine::from_weights, or with options given the engine over a backend built with them (CUDA
// options need --backend cuda, CPU options --backend cpu: InputError otherwise).
std::unique_ptr<Engine> open_engine(const std::string& dir, const EngineOptions& eo, const std::vector<std::string>& cuda_opts,
                                    const std::vector<std::string>& cpu_opts = {});
std::unique_ptr<Engine> engine_from_weights(std::shared_ptr<const ModelWeights> w, const EngineOptions& eo,
                                            const std::vector<std::string>& cuda_opts);

}  // namespace lily::cli
