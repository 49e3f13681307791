#include "backend/cpu/cpu_rank.h"

#include "backend/rank_driver.h"
#include "core/error.h"
#include "model/shard.h"

namespace lily::cpu {

CpuRank::CpuRank(std::shared_ptr<const ModelWeights> share, CpuOptions opt) : be_(std::move(share), opt) {
  be_.set_rank_mode(true);
}

RankColumns CpuRank::head_columns() {
  const ModelWeights& w = be_.weights();
  const int64_t V = w.cfg.vocab;
  std::vector<float>& l = be_.logits();
  return RankColumns{l.data(), int64_t(l.size()) / V, V, w.vocab0, w.lm_head.out};
}

std::unique_ptr<Backend> make_cpu_ranks(std::shared_ptr<const ModelWeights> w, int ranks, const CpuOptions& opt) {
  const ShardPlan plan = ShardPlan::make(*w, ranks);
  std::vector<std::unique_ptr<RankBackend>> rs;
  for (int r = 0; r < ranks; ++r) rs.push_back(std::make_unique<CpuRank>(rank_share(w, plan, r), opt));
  return std::make_unique<TensorParallel>(std::move(w), std::move(rs), std::make_unique<HostCollective>());
}

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> w, const std::string& devices,
                                          const CpuOptions& opt) {
  if (devices.empty()) return std::make_unique<CpuBackend>(std::move(w), opt);
  if (devices.find(',') != std::string::npos)
    fail("--devices {}: a device list needs --backend cuda (the CPU backend takes a rank count)", devices);
  return make_cpu_ranks(std::move(w), int(parse_devices(devices).size()), opt);
}

}  // namespace lily::cpu
