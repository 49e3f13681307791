// TensorParallel: a Backend over N ranks (rank_backend.h), each running its share of the model
// (model/shard.h). Every block runs on every rank in rank order (the ranks' own queues make the work of
// device ranks concurrent); a mixer's or FFN's parts are summed through the Collective and added on
// every rank; the head's vocabulary columns are gathered, and the outputs come from rank 0. A sequence is
// one state per rank (its KV heads, its DeltaNet heads); snapshots hold one snapshot per rank.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/rank_backend.h"

namespace lily {

// --devices: "N" (N ranks: devices 0..N-1) or a list "a,b,..." (rank r on device list[r]; a device named
// more than once runs its ranks one after another). Throws InputError naming --devices.
std::vector<int> parse_devices(const std::string& s);

class TensorParallel final : public Backend {
 public:
  // `whole`: the unsplit model (the runtime reads its config); ranks[r] runs rank r's share.
  TensorParallel(std::shared_ptr<const ModelWeights> whole, std::vector<std::unique_ptr<RankBackend>> ranks,
                 std::unique_ptr<Collective> coll);
  ~TensorParallel() override;
  std::string name() const override;
  const ModelWeights& weights() const override { return *w_; }
  std::unique_ptr<SequenceState> new_state(int64_t max_tokens) override;
  void begin(const Step& step) override;
  void embed() override;
  void gdn_mixer(int layer) override;
  void attn_mixer(int layer) override;
  void ffn(int layer) override;
  void head() override;
  uint64_t end() override;
  void finish(uint64_t ticket, const StepOutputs& out) override;
  bool can_sample() const override;
  void set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) override;
  void set_mask(SequenceState& seq, std::span<const uint64_t> mask) override;
  bool can_mtp() const override;
  void synchronize() override;
  size_t peak_memory() const override;
  int64_t preferred_prefill_chunk() const override;
  double copy_bandwidth() override;

  int ranks() const { return int(ranks_.size()); }
  RankBackend& rank(int r) { return *ranks_[size_t(r)]; }

 private:
  void reduce();  // sum the ranks' partials, add them on every rank

  std::shared_ptr<const ModelWeights> w_;
  std::vector<std::unique_ptr<RankBackend>> ranks_;
  std::unique_ptr<Collective> coll_;
  std::vector<Step> steps_;  // the current step, per rank (its groups name the rank's states)
  int64_t T_ = 0;
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> tickets_;  // (ticket, each rank's ticket), in order
  uint64_t next_ticket_ = 1;
};

}  // namespace lily
