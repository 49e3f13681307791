#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/mtp_reference.h"
#include "cli/backend_options.h"
#include "cli/registry.h"
#include "core/error.h"
#include "runtime/session.h"

namespace lily::cli {
namespace {

Register reg_logits("logits", "Write teacher-forced logits [T, vocab] (float32 LE) for a token list", [](CLI::App& app) {
  struct Opts {
    std::string model, tokens, out, backend = "cpu";
    std::vector<std::string> cuda_opts, cpu_opts;
    std::string devices;
    int64_t chunk = 0;
    bool mtp = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "Model directory")->required();
  app.add_option("--tokens", o->tokens, "Token ids, comma separated")->required();
  app.add_option("--out", o->out, "Output file (float32 little-endian, row t predicts token t+1)")->required();
  app.add_option("--prefill-chunk", o->chunk, "Tokens per forward step (0: the backend's choice, 2048 on the CPU, 8192 on CUDA)");
  app.add_option("--backend", o->backend, "cpu or cuda")->capture_default_str();
  app.add_flag("--mtp", o->mtp,
               "Write the MTP head's teacher-forced logits [T-1, vocab] instead (row t from the pair (x_{t+1}, h_t), "
               "predicting x_{t+2}); CPU reference");
  add_cuda_opt(app, o->cuda_opts);
  add_cpu_opt(app, o->cpu_opts);
  add_devices_opt(app, o->devices);
  return [o]() -> int {
    auto ids = parse_ids(o->tokens, "--tokens");
    if (ids.empty()) fail("--tokens: no token ids given");
    EngineOptions eo;
    eo.backend = o->backend;
    eo.devices = o->devices;
    eo.prefill_chunk = o->chunk;
    eo.ctx_size = int64_t(ids.size());
    if (o->mtp && o->backend != "cpu") fail("--mtp: the MTP head runs on --backend cpu (its CPU reference) for now");
    if (o->mtp && ids.size() < 2) fail("--mtp: --tokens needs at least 2 ids (row t pairs x_{{t+1}} with h_t)");
    if (o->mtp && !o->cpu_opts.empty()) fail("--mtp: the MTP reference takes no --cpu-opt");
    if (o->mtp && !o->devices.empty()) fail("--mtp: the MTP reference runs unsplit (no --devices)");
    auto engine = open_engine(o->model, eo, o->cuda_opts, o->cpu_opts);
    const int64_t V = engine->config().vocab;
    std::vector<float> logits;
    if (o->mtp) {
      engine->weights().require_mtp();
      auto& be = dynamic_cast<cpu::CpuBackend&>(engine->backend());
      auto st = be.new_state(int64_t(ids.size()));
      auto h = cpu::final_hidden_states(be, *st, ids, engine->options().prefill_chunk, nullptr);
      logits = cpu::mtp_teacher_forced(engine->weights(), ids, h.data());
    } else {
      Session s(*engine);
      logits.resize(ids.size() * size_t(V));
      s.prefill(ids, nullptr, logits.data());
    }
    FILE* f = std::fopen(o->out.c_str(), "wb");
    if (!f) fail("--out {}: cannot create file", o->out);
    size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
    bool ok = n == logits.size() && std::fclose(f) == 0;
    if (!ok) fail("--out {}: write failed", o->out);
    fmt::print(stderr, "wrote {} x {} {}logits to {}\n", logits.size() / size_t(V), V, o->mtp ? "MTP " : "", o->out);
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
