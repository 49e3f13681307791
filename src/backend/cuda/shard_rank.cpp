// CUDA ranks (shard_ranks.h): a CudaBackend in rank mode per rank, driven from one thread (every call makes
// the rank's GPU current), the fit check before any upload, the one-device collective.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "backend/cuda/shard_ops.h"
#include "backend/cuda/shard_rank.h"
#include "backend/cuda/shard_ranks.h"
#include "backend/rank_driver.h"
#include "core/error.h"
#include "model/shard.h"

namespace lily::cuda {

DeviceScope::DeviceScope(int device) { LILY_CU(cudaSetDevice(device)); }

void TurnCollective::all_reduce(std::span<float* const> bufs, size_t n) {
  DeviceScope d(device_);
  LILY_CU(cudaDeviceSynchronize());  // every rank's block is done
  std::vector<const float*> src(bufs.begin(), bufs.end());
  sum_buffers(bufs[0], src.data(), int(src.size()), n, nullptr);
  for (size_t r = 1; r < bufs.size(); ++r)
    LILY_CU(cudaMemcpyAsync(bufs[r], bufs[0], n * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
  LILY_CU(cudaDeviceSynchronize());
}

void TurnCollective::all_gather_columns(std::span<const RankColumns> parts) {
  DeviceScope d(device_);
  LILY_CU(cudaDeviceSynchronize());
  for (const RankColumns& dst : parts)
    for (const RankColumns& src : parts)
      if (&src != &dst && src.cols > 0)
        LILY_CU(cudaMemcpy2DAsync(dst.data + src.col0, size_t(dst.ld) * 4, src.data + src.col0, size_t(src.ld) * 4,
                                  size_t(src.cols) * 4, size_t(dst.rows), cudaMemcpyDeviceToDevice, nullptr));
  LILY_CU(cudaDeviceSynchronize());
}

namespace {

// A rank's sequence state, its GPU made current around every call.
class RankState final : public SequenceState {
 public:
  RankState(int device, std::unique_ptr<SequenceState> s) : device_(device), s_(std::move(s)) {}
  ~RankState() override {
    DeviceScope d(device_);
    s_.reset();
  }
  int64_t n_tokens() const override { return s_->n_tokens(); }
  int64_t capacity() const override { return s_->capacity(); }
  int64_t pending() const override { return s_->pending(); }
  void commit(int64_t n) override {
    DeviceScope d(device_);
    s_->commit(n);
  }
  int max_tentative() const override { return s_->max_tentative(); }
  void reserve_tentative(int rows) override {
    DeviceScope d(device_);
    s_->reserve_tentative(rows);
  }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    DeviceScope d(device_);
    return s_->snapshot();
  }
  void restore(const StateSnapshot& snap) override {
    DeviceScope d(device_);
    s_->restore(snap);
  }
  void reset() override {
    DeviceScope d(device_);
    s_->reset();
  }
  size_t nbytes() const override { return s_->nbytes(); }
  int64_t mtp_tokens() const override { return s_->mtp_tokens(); }
  void truncate_mtp(int64_t n) override {
    DeviceScope d(device_);
    s_->truncate_mtp(n);
  }
  int64_t hidden_rows() const override { return s_->hidden_rows(); }
  SequenceState& inner() { return *s_; }

 private:
  int device_;
  std::unique_ptr<SequenceState> s_;
};

SequenceState& inner(SequenceState& s) {
  auto* r = dynamic_cast<RankState*>(&s);
  if (!r) throw InternalError("a CUDA rank's step names a state of another backend");
  return r->inner();
}

// One rank: its CudaBackend in rank mode, the rank-mode buffers, and the blocks with its GPU current.
class CudaRank final : public RankBackend, public Backend {
 public:
  CudaRank(std::shared_ptr<const ModelWeights> share, const CudaOptions& opt, int rank, int ranks)
      : device_(opt.device), be_(std::move(share), opt) {
    ext_.rank = rank;
    ext_.ranks = ranks;
    be_.rank_ = &ext_;
    ensure(kMaxGraphRows, kMaxGraphRows);  // decode steps (and `lily inspect`'s record mode) without growing
  }
  ~CudaRank() override {
    DeviceScope d(device_);
    be_.dev_->sync();
    be_.dev_->free(ext_.partial, partial_bytes());
    be_.dev_->free(ext_.moe, ext_.moe_bytes);
    be_.dev_->free(ext_.cand, cand_bytes());
  }
  CudaBackend& cuda() { return be_; }
  cudaStream_t stream() const { return be_.stream_; }
  int device() const { return device_; }

  // RankBackend
  Backend& blocks() override { return *this; }
  float* partial() override { return ext_.partial; }
  void add_partial() override {
    DeviceScope d(device_);
    add_into(be_.x_, ext_.partial, size_t(be_.T_) * size_t(be_.w_->cfg.hidden), be_.stream_);
  }
  RankColumns head_columns() override { return ext_.head; }
  void head_finish() override {
    DeviceScope d(device_);
    be_.rank_head_finish();
  }
  bool replaying() const override { return be_.replay_; }

  // Backend: the rank's blocks
  std::string name() const override { return be_.name(); }
  const ModelWeights& weights() const override { return be_.weights(); }
  std::unique_ptr<SequenceState> new_state(int64_t max_tokens) override {
    DeviceScope d(device_);
    return std::make_unique<RankState>(device_, be_.new_state(max_tokens));
  }
  void begin(const Step& step) override {
    DeviceScope d(device_);
    Step s = step;
    for (StepGroup& g : s.groups) g.seq = &inner(*g.seq);
    ensure(int(s.rows()), int(s.sample_rows()));
    be_.begin(s);
  }
  void embed() override { run([&] { be_.embed(); }); }
  void gdn_mixer(int l) override { run([&] { be_.gdn_mixer(l); }); }
  void attn_mixer(int l) override { run([&] { be_.attn_mixer(l); }); }
  void ffn(int l) override { run([&] { be_.ffn(l); }); }
  void head() override { run([&] { be_.head(); }); }
  uint64_t end() override {
    DeviceScope d(device_);
    return be_.end();
  }
  void finish(uint64_t t, const StepOutputs& out) override {
    DeviceScope d(device_);
    be_.finish(t, out);
  }
  bool can_sample() const override { return be_.can_sample(); }
  void set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) override {
    DeviceScope d(device_);
    be_.set_sampling(inner(seq), p, history);
  }
  void set_mask(SequenceState& seq, std::span<const uint64_t> mask) override {
    DeviceScope d(device_);
    be_.set_mask(inner(seq), mask);
  }
  bool can_mtp() const override { return be_.can_mtp(); }
  void synchronize() override {
    DeviceScope d(device_);
    be_.synchronize();
  }
  size_t peak_memory() const override { return be_.peak_memory(); }
  int64_t preferred_prefill_chunk() const override { return be_.preferred_prefill_chunk(); }
  double copy_bandwidth() override {
    DeviceScope d(device_);
    return be_.copy_bandwidth();
  }

 private:
  template <typename F>
  void run(F f) {
    DeviceScope d(device_);
    f();
  }
  size_t partial_bytes() const { return 4 * size_t(ext_.cap_T) * size_t(be_.w_->cfg.hidden); }
  size_t cand_bytes() const { return 8 * size_t(ext_.cand_rows) * size_t(ext_.ranks); }
  // The rank-mode buffers for a step of T rows and S drawn rows; growing drops the captured graphs (they
  // hold the addresses).
  void ensure(int T, int S) {
    const ModelConfig& c = be_.w_->cfg;
    size_t moe = 0;
    for (const DevLayer& D : be_.layers_) {
      const MoeDev& m = D.moe;
      const int kk = m.moe ? m.slots_per_token() : 1;
      moe = std::max(moe, rank_moe_layout(nullptr, T, kk, int(c.n_experts), m.E, m.I, m.Is, int(c.hidden),
                                          rank_moe_tile_rows(T)).bytes);
    }
    if (T <= ext_.cap_T && moe <= ext_.moe_bytes && S <= ext_.cand_rows) return;
    be_.dev_->sync();
    be_.drop_graphs();
    if (T > ext_.cap_T) {
      be_.dev_->free(ext_.partial, partial_bytes());
      ext_.partial = nullptr;
      ext_.cap_T = std::max(T, 2 * ext_.cap_T);
      ext_.partial = static_cast<float*>(be_.dev_->alloc(partial_bytes()));
      be_.rank_out_ = ext_.partial;
    }
    if (moe > ext_.moe_bytes) {
      be_.dev_->free(ext_.moe, ext_.moe_bytes);
      ext_.moe = nullptr;
      ext_.moe_bytes = 0;
      ext_.moe = be_.dev_->alloc(moe);
      ext_.moe_bytes = moe;
    }
    if (S > ext_.cand_rows) {
      be_.dev_->free(ext_.cand, cand_bytes());
      ext_.cand = nullptr;
      ext_.cand_rows = std::max(S, 2 * ext_.cand_rows);
      ext_.cand = static_cast<float*>(be_.dev_->alloc(cand_bytes()));
    }
  }

  int device_;
  CudaBackend be_;
  RankExt ext_;
};

}  // namespace
}  // namespace lily::cuda

namespace lily {

size_t cuda_rank_working_bytes(const ModelConfig& c) {
  // logits of 256 rows, activations and the MoE scratch of an 8192-row prompt chunk (every slot on this rank:
  // the bound), a few sequences' state
  const int T = 8192;
  const size_t logits = 256 * size_t(c.vocab) * 4, acts = size_t(T) * size_t(c.hidden) * 4 * 8;
  const size_t moe = c.n_experts > 0 ? cuda::rank_moe_layout(nullptr, T, int(c.top_k) + 1, int(c.n_experts), int(c.n_experts),
                                                             int(c.moe_inter), int(c.shared_inter), int(c.hidden), 64).bytes
                                     : 0;
  return logits + acts + moe + (size_t(512) << 20);
}

std::unique_ptr<Backend> make_cuda_ranks(std::shared_ptr<const ModelWeights> w, const std::vector<int>& devices,
                                         const CudaOptions& opt) {
  using namespace cuda;
  const int n = int(devices.size());
  if (n < 1) fail("--devices: no device");
  int present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess) {
    (void)cudaGetLastError();
    present = 0;
  }
  for (int d : devices)
    if (d >= present) fail("--devices: GPU {} is not present ({} CUDA device{} present)", d, present, present == 1 ? "" : "s");
  const std::set<int> distinct(devices.begin(), devices.end());
  const bool turn = distinct.size() == 1 && n > 1;
  if (!turn && int(distinct.size()) != n)
    fail("--devices: a GPU named more than once runs its ranks in turn, which takes one GPU named for every rank "
         "(got {} ranks on {} GPUs)", n, distinct.size());
  const ShardPlan plan = ShardPlan::make(*w, n);  // names the field that does not divide
  // every GPU holds its ranks' shares and their working memory: checked before anything is uploaded
  for (int d : distinct) {
    size_t need = 0, weights = 0;
    std::vector<int> on;
    for (int r = 0; r < n; ++r)
      if (devices[size_t(r)] == d) {
        weights += rank_weight_bytes(*w, plan, r, true);
        need += cuda_rank_working_bytes(w->cfg);
        on.push_back(r);
      }
    need += weights;
    size_t free = 0, total = 0;
    DeviceScope s(d);
    LILY_CU(cudaMemGetInfo(&free, &total));
    if (need > free) {
      std::string rs;
      for (int r : on) rs += fmt::format("{}{}", rs.empty() ? "" : ",", r);
      fail("--devices: the model does not fit: rank{} {} need{} {:.1f} GiB on GPU {} ({:.1f} GiB of weights + {:.1f} GiB "
           "working memory), {:.1f} GiB free of {:.1f} GiB", on.size() == 1 ? "" : "s", rs, on.size() == 1 ? "s" : "",
           double(need) / 1073741824.0, d, double(weights) / 1073741824.0, double(need - weights) / 1073741824.0,
           double(free) / 1073741824.0, double(total) / 1073741824.0);
    }
  }
  if (n == 1) {
    CudaOptions o = opt;
    o.device = devices[0];
    return make_cuda_backend(std::move(w), o);
  }
  std::unique_ptr<Collective> coll;
  std::vector<std::unique_ptr<RankBackend>> ranks;
  std::vector<cudaStream_t> streams;
  for (int r = 0; r < n; ++r) {
    CudaOptions o = opt;
    o.device = devices[size_t(r)];
    if (turn) o.graphs = false;  // the turn collective waits for the device between blocks
    auto rank = std::make_unique<CudaRank>(rank_share(w, plan, r), o, r, n);
    streams.push_back(rank->stream());
    ranks.push_back(std::move(rank));
  }
  if (turn) coll = std::make_unique<TurnCollective>(devices[0]);
  else coll = make_nccl_collective(devices, streams);
  return std::make_unique<TensorParallel>(std::move(w), std::move(ranks), std::move(coll));
}

Backend& cuda_rank_backend(Backend& split, int r) {
  auto* tp = dynamic_cast<TensorParallel*>(&split);
  if (!tp) return split;  // one device: the plain backend
  if (r < 0 || r >= tp->ranks()) fail("rank {} of {}", r, tp->ranks());
  auto* cr = dynamic_cast<cuda::CudaRank*>(&tp->rank(r));
  if (!cr) fail("cuda_rank_backend: rank {} is not a CUDA rank", r);
  return cr->cuda();
}

}  // namespace lily
