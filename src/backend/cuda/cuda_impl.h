// Internals of the CUDA backend shared by its host files (not a public header): the device context, the
// pinned-memory pool, the sequence state with its snapshots, and the backend class. Jobs by file:
// upload.cpp (weights, shape checks), state.cpp (slots, snapshots), cuda_step.cpp (descriptor, tickets),
// blocks.cpp (the blocks), graphs.cpp (capture, replay, record), sampling.cpp (device sampler),
// cuda_mtp.cpp (the MTP block's weights, its embed and kept rows), api.cpp (the public functions),
// options.cpp (CudaOptions by name).
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attn.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/mk.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/sample.h"
#include "backend/cuda/step_desc.h"

namespace lily::cuda {

// The device, its stream and an allocation tally (peak_memory). Shared by the backend, its states and
// their snapshots, which may outlive the backend object (prompt caches).
struct Device {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  size_t cur = 0, peak = 0;
  explicit Device(int ord);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  // Throws InputError naming the size when the device memory is exhausted.
  void* alloc(size_t bytes);
  void free(void* p, size_t bytes);
  void sync() const;
};

// Page-locked host blocks for stream-ordered copies (step descriptors up, drawn ids and staged logits
// down). A block is handed back only once no queued copy uses it.
class PinnedPool {
 public:
  struct Block {
    void* p = nullptr;
    size_t bytes = 0;
  };
  ~PinnedPool();
  Block get(size_t bytes);
  void put(Block& b);  // b is empty afterwards

 private:
  std::vector<Block> free_;
};

struct DevLayer {
  LayerKind kind;
  float *in_norm = nullptr, *post_norm = nullptr;
  // DeltaNet
  std::vector<std::pair<Mat, int>> gdn_in;  // runs of [qkv|z|b|a] rows in one format: (matrix, rows)
  Mat gdn_out;                              // [H, Hv·dv]
  GdnDev gdn;
  // attention
  std::vector<std::pair<Mat, int>> attn_in;  // runs of [q|gate ·Hq, k, v] rows
  Mat attn_o;                                // [H, Hq·hd]
  AttnDev attn;
  MoeDev moe;
};

class CudaBackend;
struct RankExt;  // shard_rank.h

// A saved sequence: per attention layer its n K rows then its n V rows ([Hkv][n][hd] bf16 each), per
// DeltaNet layer the conv state then the recurrent state of the current version, then (MTP models) the
// MTP layer's mtp_n K and V rows, in one device block.
class CudaSnapshot final : public StateSnapshot {
 public:
  ~CudaSnapshot() override;
  int64_t n_tokens() const override { return n; }
  size_t nbytes() const override { return bytes; }
  // CPU order (cpu_backend.cpp): per layer K [n][Hkv·hd], V [n][Hkv·hd], conv [K-1][C], S [Hv][dv][dk];
  // then the MTP layer's K, V [mtp_n][Hkv·hd].
  std::vector<float> contents() const override;

  std::shared_ptr<Device> dev;
  std::shared_ptr<const ModelWeights> w;
  const CudaBackend* owner = nullptr;  // identity only (restore checks it)
  int64_t n = 0, mtp_n = 0;
  void* mem = nullptr;
  size_t bytes = 0;
  std::vector<size_t> off;  // per layer: offset of its first piece
};

class CudaState final : public SequenceState {
 public:
  CudaState(CudaBackend& be, int64_t cap, int slot);
  ~CudaState() override;
  int64_t n_tokens() const override { return n_; }
  int64_t capacity() const override { return cap_; }
  int64_t pending() const override { return pending_; }
  void commit(int64_t n) override;
  int max_tentative() const override { return R_ - 1; }
  void reserve_tentative(int rows) override;
  std::unique_ptr<StateSnapshot> snapshot() const override;
  void restore(const StateSnapshot& s) override;
  void reset() override;
  size_t nbytes() const override {
    return fixed_bytes_ + size_t(n_) * kv_bytes_per_token_ + size_t(mtp_n_) * kv_layer_bytes_ +
           4 * size_t(hidden_cap_) * size_t(H_);
  }
  int64_t mtp_tokens() const override { return mtp_n_; }
  void truncate_mtp(int64_t n) override;  // cuda_mtp.cpp
  int64_t hidden_rows() const override { return hidden_n_; }
  // Room for `rows` kept rows (a main step keeping its hidden rows); growing waits for queued steps.
  void ensure_hidden(int64_t rows);  // cuda_mtp.cpp

  // Version j steps after the current one (the state after tentative row j - 1).
  int ver(int j) const { return (cur_ + j) % R_; }
  float* conv_at(size_t l, int v) const { return conv[l] + size_t(v) * conv_n_; }
  float* S_at(size_t l, int v) const { return S[l] + size_t(v) * S_n_; }
  DevSlotLayer table_entry(size_t l) const;

  CudaBackend& be_;
  std::shared_ptr<Device> dev_;
  int slot_;
  int64_t cap_, n_ = 0, pending_ = 0;
  int R_ = 1, cur_ = 0;
  bool fed_ = false;  // a sampled step has been enqueued: the slot's fed word holds its id
  // device sampler (sampling.cpp): counts [V], dense bias [V] and mask words, allocated on first use
  bool sampler_ = false;       // set_sampling done
  bool greedy_plain_ = false;  // its parameters draw the plain argmax
  bool mask_on_ = false;       // a mask waits for its next sampled row
  int32_t* counts_ = nullptr;
  float* bias_ = nullptr;
  uint64_t* mask_ = nullptr;
  std::vector<uint16_t*> k, v;  // per layer (attention layers), then the MTP layer's (index cfg.layers)
  std::vector<float*> conv, S;  // per layer (DeltaNet layers): version 0 of the ring
  void* kv_region = nullptr;
  void* ring_region = nullptr;
  size_t kv_region_bytes = 0, ring_region_bytes = 0;
  size_t conv_n_ = 0, S_n_ = 0;  // floats per version
  size_t fixed_bytes_ = 0, kv_bytes_per_token_ = 0;  // kv: one token's K and V rows in every attention layer
  size_t kv_layer_bytes_ = 0;                        // one token's K and V rows in one layer (the MTP layer's)
  // MTP (models with the block): the MTP layer's KV rows, the kept post-final-norm rows of the latest main
  // step (hidden_, grown on demand, [hidden_cap_][H]) and the h' of the latest MTP step's last row [H]
  int64_t H_ = 0, mtp_n_ = 0, hidden_n_ = 0, hidden_cap_ = 0;
  bool has_mtp_h_ = false;
  float* hidden_ = nullptr;
  float* hprime_ = nullptr;

 private:
  void alloc_ring(int R);
};

// The descriptor of one step: where each array sits in the (host and device) block. A function of the
// step's shape only, so that a captured graph's pointers stay valid for any step of its key.
struct DescLayout {
  size_t tokens = 0, row_group = 0, groups = 0, out_rows = 0;
  size_t sample_src = 0, sample_slot = 0, sample_off = 0, sample_fed = 0;
  size_t attn_short = 0, attn_short_rows = 0, gdn_short = 0, gdn_short_rows = 0, hidden = 0, bytes = 0;
};
// Arrays: tokens [T], row_group [T], groups [G], out_rows [O] (the step rows whose logits are computed, in
// group order), per sampled row (S) its logits row, slot, rank within its group and fed slot (-1: not the
// group's last), the short groups of the attention and of the DeltaNet with their step rows, and the
// hidden input of each row of an MTP step [n_hidden].
DescLayout desc_layout(int T, int G, int O, int S, int n_attn_short, int n_attn_short_rows, int n_gdn_short,
                       int n_gdn_short_rows, int n_hidden = 0);

// A captured decode graph: its step shape (slot: the slot whose state pointers it holds, -1: it reads the
// slot table).
// kind: 0 logits only, 1 ids by the plain argmax, 2 ids by the sampler; tail: the logits rows are the
// step's last O rows (no gather).
// mtp: an MTP step; keep: a main step of which some group keeps its hidden rows.
struct GraphKey {
  int slot = -1, T = 0, G = 0, bucket = 0, O = 0, S = 0, kind = 0;
  bool tail = true, mtp = false, keep = false;
  int head_vocab = 0;  // an MTP step's Step::head_vocab
  bool operator<(const GraphKey& o) const {
    return std::tie(slot, T, G, bucket, O, S, kind, tail, mtp, keep, head_vocab) <
           std::tie(o.slot, o.T, o.G, o.bucket, o.O, o.S, o.kind, o.tail, o.mtp, o.keep, o.head_vocab);
  }
};
constexpr int kMaxGraphRows = 64;  // steps of more rows run uncaptured

// One step submitted with end() and not yet finished.
struct Flight {
  uint64_t ticket = 0;
  cudaEvent_t done = nullptr;     // after the step's device work and its output copies
  PinnedPool::Block desc, ids, staged;
  std::vector<PinnedPool::Block> uploads;  // sources of copies queued before the step
  std::vector<std::pair<int64_t, int64_t>> logit_ranges;  // (row of the logits buffer, rows) in group order
  int64_t logit_rows = 0, sample_rows = 0;
  bool staged_logits = false;  // the logits were copied to `staged` (a later step reuses the buffer)
  bool mk = false;             // the step ran as the decode step kernel
};

struct MkState;

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::shared_ptr<const ModelWeights> w, const CudaOptions& opt);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
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
  void synchronize() override { dev_->sync(); }
  bool can_sample() const override { return w_->cfg.vocab <= kSampleMaxVocab; }
  bool can_mtp() const override { return true; }
  void set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) override;
  void set_mask(SequenceState& seq, std::span<const uint64_t> mask) override;
  size_t peak_memory() const override { return dev_->peak; }
  // Longer steps fill the expert tiles of the grouped GEMMs (8 slots × T / E rows per expert) and run
  // fewer launches per token; the scratch grows with T (35B-A3B affine4: 22.2 GB peak at 8192, 20.3 at 2048).
  int64_t preferred_prefill_chunk() const override { return 8192; }
  // Device-to-device cudaMemcpy of 1 GiB (bytes read + written per second), median of 5, measured once.
  double copy_bandwidth() override;

  std::vector<KernelLaunch> describe(int64_t ctx, int rows, int groups);
  CudaBlockProfile block_profile() const;

  // ---- weights (upload.cpp)
  void upload_weights();
  Mat upload(const std::vector<const Linear*>& parts);
  Mat upload(const Linear& l) { return upload(std::vector<const Linear*>{&l}); }
  Mat upload_exl3(const std::vector<const Linear*>& parts, int per_expert);
  std::vector<std::pair<Mat, int>> upload_runs(const std::vector<const Linear*>& parts);
  void upload_layer(const LayerWeights& L, DevLayer& D, int l);
  void upload_mtp();  // cuda_mtp.cpp: the MTP block, its layer as layers_[cfg.layers]
  void* alloc_w(size_t bytes);
  float* upload_f32(const std::vector<float>& v);

  // ---- pool (state.cpp)
  int take_slot(CudaState* st);
  void release_slot(int slot);
  void put_slot_table(const CudaState& st);  // stream-ordered upload of the slot's table entries
  size_t table_rows() const { return size_t(w_->cfg.layers) + (w_->mtp ? 1 : 0); }  // layers, then the MTP row
  // Stream-ordered copy of `bytes` from host memory into device memory through a pinned block (the source
  // may go away at once); the block goes back to the pool when the next step's ticket is finished.
  void upload_async(void* dst, const void* src, size_t bytes);
  CudaState& own(SequenceState& seq, const char* what);

  // ---- sampler (sampling.cpp)
  void ensure_sampler_rows(int rows);
  void put_sample_slot(const CudaState& st, const SampleSlot& e);

  // ---- step (cuda_step.cpp)
  void ensure_scratch(int T, size_t work);
  void ensure_logits(int64_t rows);
  void ensure_desc(size_t bytes);
  void stage_flights();
  void abandon_step();  // copies logits still in the device buffer to their flights' pinned blocks
  void mark(int layer, const char* blk);
  // ---- MTP (cuda_mtp.cpp)
  void mtp_embed();   // the MTP step's embed block
  void keep_hidden(); // head(): the kept main rows, or the MTP step's h' per group
  int bucket_for(int64_t ctx) const {
    int b = 0;
    while ((int64_t(256) << b) < ctx) ++b;
    return b;
  }
  cudaEvent_t get_event();
  void put_event(cudaEvent_t e);

  // ---- graphs (graphs.cpp)
  // ---- the decode step as one kernel (mk_backend.cpp, mk.h)
  std::string mk_uncovered();  // why the model is not covered ("" when it is); computed once
  void mk_alloc();
  void mk_release();  // the plans (they hold scratch addresses)
  void mk_free();
  void mk_begin();
  int mk_add(mk::OpDesc op, std::vector<int> deps);
  uint32_t mk_stage_cap() const;
  std::vector<int> mk_in_proj(const std::vector<std::pair<Mat, int>>& runs, const float* norm, int layer);
  void mk_embed();
  void mk_gdn(int layer);
  void mk_attn(int layer);
  void mk_ffn(int layer);
  void mk_head();
  void mk_wait(cudaEvent_t done);  // synchronises; a failed step kernel throws naming its op
  CudaMkInfo mk_info();

  void begin_capture();
  // Ends the capture (record mode: lists the nodes into recorded_ and drops the graph); returns the
  // executable graph to launch, or null in record mode.
  cudaGraphExec_t end_capture();
  void drop_graphs();
  void drop_slot_graphs(int slot);

  std::shared_ptr<const ModelWeights> w_;
  CudaOptions opt_;
  std::shared_ptr<Device> dev_;
  cudaStream_t stream_ = nullptr, side_ = nullptr;  // side_: shared expert, forked/joined by events
  bool exl3_scratch_ = false;  // the streams hold the split EXL3 GEMVs' scratch (the model has EXL3 weights)
  // Rows up to which a step's RMSNorms fuse into its products (norm_fuse_rows). EXL3 models keep kGemvMaxRows:
  // their dense products of several rows (exl3_rows) take no fused norm, and the per-row EXL3 GEMVs lose to
  // them and to the grouped experts from 6 rows (bench/RESULTS.md).
  int fuse_rows() const { return exl3_scratch_ ? kGemvMaxRows : norm_fuse_rows(); }
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::vector<DevLayer> layers_;  // the model's layers, then (MTP models) the MTP layer
  Mat embed_, lm_head_;
  float* final_norm_ = nullptr;
  Mat mtp_fc_;  // [H, 2H]
  float *mtp_norm_e_ = nullptr, *mtp_norm_h_ = nullptr, *mtp_norm_ = nullptr;
  float* inv_freq_ = nullptr;
  std::vector<std::pair<void*, size_t>> weight_allocs_;
  int max_proj_ = 0, max_core_ = 0;
  double copy_bw_ = 0;
  // zeroed words that kernels leave zero: the argmax scratch (argmax_scratch_bytes(kArgmaxRows)), then
  // the top-k fold counter shared by the MoE layers, then (8 bytes on) the dense layers' expert id 0
  static constexpr int kArgmaxRows = 256;
  void* small_ = nullptr;
  static size_t small_bytes() { return (argmax_scratch_bytes(kArgmaxRows) + 15) / 16 * 16 + 16; }
  unsigned* topk_counter() const {
    return reinterpret_cast<unsigned*>(static_cast<char*>(small_) + (argmax_scratch_bytes(kArgmaxRows) + 15) / 16 * 16);
  }
  // a word after the counter that nothing writes: expert id 0 for the dense MLP layers (MoeDev::zero_id)
  const int32_t* zero_id() const {
    return reinterpret_cast<const int32_t*>(static_cast<char*>(small_) + (argmax_scratch_bytes(kArgmaxRows) + 15) / 16 * 16 + 8);
  }

  // pool
  std::vector<CudaState*> slots_;  // by slot; null: free
  DevSlotLayer* slot_tab_ = nullptr;  // device [table_rows()][slot_cap_]
  int slot_cap_ = 0;
  int32_t* fed_ = nullptr;  // device [slot_cap_]: the id the device drew last for each slot
  SampleSlot* samp_slots_ = nullptr;  // device [slot_cap_]: each slot's sampler
  SampleDev samp_;                    // per-row scratch of the sampler
  void* samp_mem_ = nullptr;
  size_t samp_bytes_ = 0;
  std::vector<PinnedPool::Block> uploads_;  // pinned sources of copies queued since the last end()

  // scratch (grown in begin(); growing drops captured graphs)
  int cap_T_ = 0;
  uint64_t scratch_gen_ = 1;
  float *x_ = nullptr, *u_ = nullptr, *proj_ = nullptr, *core_ = nullptr, *logits_ = nullptr;
  int32_t* ids_dev_ = nullptr;  // [cap_T_] ids drawn by the current step
  void* work_ = nullptr;
  void* scratch_ = nullptr;
  size_t work_bytes_ = 0, scratch_bytes_ = 0;
  int64_t logits_rows_ = 0;
  void* desc_dev_ = nullptr;
  size_t desc_cap_ = 0;
  PinnedPool pinned_;
  std::vector<cudaEvent_t> events_;

  // current step
  struct Group {
    CudaState* st;
    int32_t first, rows, out_rows;
    bool logits, sample, tentative, keep;
    int64_t pos0;                // position of its first row (MTP steps: in the MTP cache)
    bool attn_short, gdn_short;  // batched in the short launches (else one launch per group)
    int nsplit;                  // attention split (long groups)
  };
  std::vector<Group> groups_;
  int T_ = 0, O_ = 0, S_ = 0;  // rows, rows whose logits are computed, rows whose ids are drawn
  int kind_ = 0;               // GraphKey::kind
  bool mtp_ = false;           // an MTP step (Step::mtp)
  int head_vocab_ = 0;         // its Step::head_vocab
  bool keep_ = false;          // a main step of which some group keeps its hidden rows
  int n_attn_short_ = 0, n_attn_short_rows_ = 0, n_gdn_short_ = 0, n_gdn_short_rows_ = 0;
  int nsplit_short_ = 1;       // attention split of the short launch
  bool ba_groups_ = false;     // every group short, at most kBaFoldRows rows: the b|a fold rides in gdn_groups
  DescLayout lay_;
  PinnedPool::Block desc_host_;
  bool out_tail_ = true;     // the logits rows are the step's last O_ rows, in order
  bool capture_ = false, replay_ = false, recording_ = false, stepping_ = false;
  cudaGraphExec_t exec_ = nullptr;  // graph to replay in end()
  GraphKey graph_key_;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::unique_ptr<MkState> mk_state_;
  bool mk_ = false;            // this step runs as the decode step kernel
  bool mk_plan_only_ = false;  // record mode: this step builds its plan, launches nothing
  std::deque<Flight> flights_;
  uint64_t next_ticket_ = 1;
  // profile
  std::map<std::string, double> prof_;
  std::string prof_block_;
  std::chrono::steady_clock::time_point prof_t0_;
  int64_t prof_steps_ = 0;
  // record mode: graph node counts at block boundaries, then the listed launches
  std::vector<std::pair<size_t, std::pair<int, std::string>>> marks_;
  std::vector<KernelLaunch> recorded_;

  // ---- rank mode (shard_blocks.cpp, backend/rank_backend.h): set by the CudaRank that owns this backend.
  // The mixers write their output to rank_out_ instead of adding it to x_; ffn() and head() run the rank's
  // MoE (its expert range) and its vocabulary rows.
  RankExt* rank_ = nullptr;
  float* rank_out_ = nullptr;
  void rank_ffn(int layer);
  void rank_head();
  void rank_head_finish();

  const int32_t* d_tokens() const { return reinterpret_cast<const int32_t*>(static_cast<char*>(desc_dev_) + lay_.tokens); }
  const int32_t* d_row_group() const {
    return reinterpret_cast<const int32_t*>(static_cast<char*>(desc_dev_) + lay_.row_group);
  }
  const DevGroup* d_groups() const { return reinterpret_cast<const DevGroup*>(static_cast<char*>(desc_dev_) + lay_.groups); }
  const int32_t* d_i32(size_t off) const { return reinterpret_cast<const int32_t*>(static_cast<char*>(desc_dev_) + off); }
  const int32_t* d_out_rows() const { return d_i32(lay_.out_rows); }
  StepSeqs seqs(int layer) const {
    StepSeqs s;
    s.row_group = d_row_group();
    s.groups = d_groups();
    s.slots = slot_tab_ + size_t(layer) * size_t(slot_cap_);
    return s;
  }
};

bool same_format(const Linear& a, const Linear& b);
// Throws InputError naming the config field when the CUDA kernels do not cover the model's shape.
void check_cuda_shape(const ModelConfig& c);

}  // namespace lily::cuda
