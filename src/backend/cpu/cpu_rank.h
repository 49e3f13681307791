// A CPU rank (backend/rank_backend.h): the CPU backend in rank mode over one rank's share, and the model
// split over N such ranks run one after another (the executable specification of the split; tests compare
// it with the unsplit CPU backend).
#pragma once
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/rank_backend.h"

namespace lily::cpu {

class CpuRank final : public RankBackend {
 public:
  CpuRank(std::shared_ptr<const ModelWeights> share, CpuOptions opt = {});
  Backend& blocks() override { return be_; }
  float* partial() override { return be_.partial().data(); }
  void add_partial() override { be_.add_partial(); }
  RankColumns head_columns() override;
  void head_finish() override {}

 private:
  CpuBackend be_;
};

// `w` split over `ranks` CPU ranks (model/shard.h) behind one Backend (backend/rank_driver.h). Throws
// InputError naming the config field when the model does not divide.
std::unique_ptr<Backend> make_cpu_ranks(std::shared_ptr<const ModelWeights> w, int ranks, const CpuOptions& opt = {});
// The CPU backend, or with --devices N (EngineOptions::devices, "" none) N CPU ranks; a device list is an
// InputError (it names GPUs).
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> w, const std::string& devices,
                                          const CpuOptions& opt = {});

}  // namespace lily::cpu
