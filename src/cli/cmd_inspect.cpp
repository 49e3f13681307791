// `lily inspect --model DIR | --synth PRESET --format F [--bits K] --backend cuda [--context N] [--rows R
// --groups G] [--cuda-opt name=value ...] [--json]`: the kernels of one captured decode step (per layer and
// block, with launch shapes) — the number to drive down. The step is the runtime's device decode step:
// G sequences of R / G rows each, every one drawing its next id greedily on the device.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/registry.h"
#include "core/error.h"
#include "model/weights.h"
#include "tools/synth.h"
#ifdef LILY_HAVE_CUDA
#include <cxxabi.h>

#include <cstdlib>
#include <algorithm>
#include <map>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/shard_ranks.h"
#endif

namespace lily::cli {
namespace {

#ifdef LILY_HAVE_CUDA
// "lily::cuda::(anonymous namespace)::gemv_kernel<4>(...)" -> "gemv_kernel<4>"
std::string short_name(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  const size_t colon = s.rfind("::", s.find('<') == std::string::npos ? std::string::npos : s.find('<'));
  if (colon != std::string::npos) s = s.substr(colon + 2);
  return s;
}
#endif

Register reg_inspect("inspect", "Show the kernels of one decode step on a backend (launch shapes per layer)", [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>("cuda");
  auto ctx = std::make_shared<int64_t>(4096);
  auto json = std::make_shared<bool>(false);
  auto synth = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("bf16");
  auto bits = std::make_shared<int>(4);
  auto rows = std::make_shared<int>(1);
  auto groups = std::make_shared<int>(1);
  auto cuda_opts = std::make_shared<std::vector<std::string>>();
  auto devices = std::make_shared<std::string>();
  app.add_option("--model", *model, "Model directory (config.json + safetensors)");
  app.add_option("--synth", *synth, "Build a random model of this preset in memory instead (see lily synth)");
  app.add_option("--format", *format, "With --synth: bf16 | affine4 | affine8 | exl3");
  app.add_option("--bits", *bits, "With --synth --format exl3: K");
  app.add_option("--backend", *backend, "Backend whose decode step to show (cuda)")->capture_default_str();
  app.add_option("--context", *ctx, "Tokens already in the cache (selects the context bucket)")->capture_default_str();
  app.add_option("--rows", *rows, "Rows of the step (all groups together)")->capture_default_str();
  app.add_option("--groups", *groups, "Sequences in the step (rows / groups rows each)")->capture_default_str();
  add_cuda_opt(app, *cuda_opts);
  add_devices_opt(app, *devices);  // rank 0's decode step (the all-reduces between its blocks are not listed)
  app.add_flag("--json", *json, "Print JSON");
  return [=]() -> int {
    if (*backend != "cuda") fail("--backend {}: inspect shows the CUDA decode graph (use --backend cuda)", *backend);
    if (*ctx < 0) fail("--context must be >= 0, got {}", *ctx);
    if (model->empty() == synth->empty()) fail("inspect: give exactly one of --model DIR or --synth PRESET");
#ifndef LILY_HAVE_CUDA
    fail("--backend cuda: this build has no CUDA backend (configure with nvcc present)");
#else
    if (!cuda_available()) fail("--backend cuda: {}", cuda_device_info());
    std::shared_ptr<const ModelWeights> w;
    if (!synth->empty()) {
      SynthOptions so;
      so.preset = *synth;
      so.format = parse_synth_format(*format);
      so.exl3_bits = *bits;
      so.shapes_only = !devices->empty();  // drawn on the GPUs
      w = synth_model(so);
    } else {
      w = ModelWeights::load(*model);
    }
    auto be = make_backend_with(w, *cuda_opts, *devices);
    Backend& one = devices->empty() ? *be : cuda_rank_backend(*be, 0);  // split: rank 0's kernels
    const auto ks = cuda_describe_decode_step(one, *ctx, *rows, *groups);
    // the step kernel (--cuda-opt mk=1): its op list, when this step ran it
    const CudaMkInfo mk = cuda_mk_info(one);
    const bool mk_ran = std::any_of(ks.begin(), ks.end(), [](const KernelLaunch& k) { return k.name.find("mk_kernel") != std::string::npos; });
    std::map<int, int> per_layer;
    for (const auto& k : ks) ++per_layer[k.layer];
    if (*json) {
      nlohmann::json j;
      j["device"] = cuda_device_info();
      j["context"] = *ctx;
      j["rows"] = *rows;
      j["groups"] = *groups;
      j["kernels_per_step"] = ks.size();
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& k : ks)
        arr.push_back({{"name", short_name(k.name)}, {"layer", k.layer}, {"block", k.block},
                       {"grid", {k.grid[0], k.grid[1], k.grid[2]}}, {"block_dim", {k.threads[0], k.threads[1], k.threads[2]}},
                       {"smem", k.smem}});
      j["kernels"] = arr;
      if (mk_ran) j["step_kernel_ops"] = mk.ops;
      else if (!mk.uncovered.empty()) j["step_kernel_uncovered"] = mk.uncovered;
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("device   {}\ncontext  {} tokens\nstep     {} rows in {} groups\nkernels  {} per decode step ({:.1f} per layer over {} layers)\n\n",
               cuda_device_info(), *ctx, *rows, *groups, ks.size(), double(ks.size()) / double(std::max<int64_t>(1, w->cfg.layers)),
               w->cfg.layers);
    int last = -2;
    std::string last_block;
    for (const auto& k : ks) {
      if (k.layer != last || k.block != last_block) {
        if (k.layer >= 0) fmt::print("layer {:>3} {:<5} ({} kernels in layer)\n", k.layer, k.block, per_layer[k.layer]);
        else fmt::print("{}\n", k.block);
        last = k.layer;
        last_block = k.block;
      }
      std::string name = short_name(k.name);
      if (name.size() > 60) name = name.substr(0, 57) + "...";
      fmt::print("    {:<60} grid ({},{},{}) block ({},{},{}) smem {}\n", name, k.grid[0], k.grid[1], k.grid[2], k.threads[0],
                 k.threads[1], k.threads[2], k.smem);
    }
    if (mk_ran) {
      fmt::print("\nthe step kernel's ops ({}; ops of one level wait only for ops of lower levels):\n", mk.ops.size());
      for (const auto& line : mk.ops) fmt::print("{}\n", line);
    } else if (!mk.uncovered.empty()) {
      fmt::print("\nthe step kernel does not cover this model: {}\n", mk.uncovered);
    }
    return 0;
#endif
  };
});

}  // namespace
}  // namespace lily::cli
