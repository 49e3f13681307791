// CPU backend: float32 implementation of every block (the executable specification), with threaded
// matmuls and heads processed in parallel. State per sequence: fp32 KV cache [pos][Hkv·hd] per attention
// layer, conv state (last K-1 pre-conv qkv rows) and fp32 recurrent state [Hv][dv][dk] per DeltaNet
// layer, the latter two in a ring of versions when tentative steps are reserved (one per checkpoint);
// the MTP layer's KV rows, the kept post-final-norm rows of the latest main step and the last h' of the
// latest MTP step. Steps run synchronously: end() returns with the outputs computed.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/operand_emulation.h"

namespace lily::cpu {

struct CpuOptions {
  // Groups of at most this many rows use the recurrent delta rule; longer ones the chunked form (a
  // property of the group, not of the step, so a sequence's result does not depend on its batch).
  int64_t recurrent_max_rows = 16;
  // Affine 4/8-bit products: int8 activations (fast) or float activations (exact; see matmul.h).
  AffinePath affine = affine_path_default();
  // Products of these classes (backend/product_class.h masks) with bf16 or fp16 operands (fp16 wins where
  // both name a class), emulating the CUDA backend's reduced-operand prompt GEMMs (operand_emulation.h), in
  // steps of at least emulate_bf16_rows rows: the CUDA backend's GEMM path (up to 32 rows it runs fp32 GEMVs
  // and multi-row GEMVs; lm_head counts its output rows). 0: off, every product float32 (decode steps are
  // below the row count whatever the masks).
  uint32_t emulate_bf16 = 0;
  uint32_t emulate_fp16 = 0;
  int64_t emulate_bf16_rows = 33;
  // The other classes' products in those steps with the split mode's operands (Operand::kSplit, CUDA's
  // `--precision high`; EXL3 weights stay float32).
  bool emulate_split = false;
  // Keys and values rounded to bf16 as they enter the cache, as the CUDA backend's KV cache holds them (every
  // step; its prompt attention's bf16 Q / P operands are not emulated).
  bool emulate_bf16_kv = false;
  // The emulated products sum over k in order (0), reversed (1) or from the middle round (2)
  // (operand_emulation.h): how far a change of fp32 summation order alone moves the logits, the yardstick of the
  // device-vs-emulation tests.
  int emulate_k_order = 0;
};

// CpuOptions by name, the CLI's repeated --cpu-opt name=value (InputError for an unknown name or a bad value).
void set_cpu_option(CpuOptions& o, const std::string& name_eq_value);
std::vector<std::string> cpu_option_names();

class CpuState;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::shared_ptr<const ModelWeights> w, CpuOptions opt = {});
  std::string name() const override { return "cpu"; }
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
  size_t peak_memory() const override { return peak_; }
  bool can_mtp() const override { return true; }

  // Residual stream of the current step [T, H] (tests read it).
  const std::vector<float>& residual() const { return x_; }
  CpuOptions& options() { return opt_; }

  // Rank mode (backend/rank_backend.h, cpu_rank.h): the mixers and the FFN leave their output in partial()
  // instead of adding it to the residual stream; head() writes the lm_head rows' columns
  // [vocab0, vocab0 + lm_head.out) of its [rows, V] logits (logits()), zero elsewhere.
  void set_rank_mode(bool on) { rank_mode_ = on; }
  std::vector<float>& partial() { return partial_; }
  void add_partial();
  std::vector<float>& logits() { return out_; }

 private:
  struct Group {
    CpuState* st;
    int64_t first, rows, pos0, out_rows;
    bool logits, tentative, keep_hidden;
  };
  const LayerWeights& layer_weights(int layer) const;  // layer == cfg.layers: the MTP layer
  void expert_mlp(const Expert& e, const float* u, int64_t rows, float* out, uint32_t cls);
  // Whether products of class `cls` run with reduced operands in a step of `rows` rows (CpuOptions::emulate_*),
  // and which.
  bool reduced(uint32_t cls, int64_t rows, Operand& op) const;
  // y = x · Wᵀ for a product of class `cls` in a step of `rows` rows.
  void mm(const Linear& W, const float* x, int64_t T, float* y, uint32_t cls, int64_t rows) const;
  // Independent products, each of its class (the MoE's batched passes).
  void mm_batch(const std::vector<MatJob>& jobs, const std::vector<uint32_t>& cls) const;
  // x += out (rank mode: out becomes partial()).
  void emit(std::vector<float>& out);

  std::shared_ptr<const ModelWeights> w_;
  CpuOptions opt_;
  std::vector<int32_t> tokens_, hidden_src_;
  bool mtp_ = false;  // the current step runs the MTP block
  int64_t head_vocab_ = 0;  // the step's Step::head_vocab
  // lm_head views of the first n rows (MTP steps with a head_vocab), by n
  mutable std::map<int64_t, Linear> head_prefix_;
  std::vector<Group> groups_;
  std::vector<int64_t> pos_;  // per row
  int64_t T_ = 0;
  std::vector<float> x_, u_;  // residual, normed input
  std::vector<float> a_, b_, c_, d_, e_;  // scratch
  // outputs of ended steps not yet finished: (ticket, logits rows)
  std::deque<std::pair<uint64_t, std::vector<float>>> done_;
  std::vector<float> out_;
  std::vector<float> spare_;  // a finished step's logits buffer, reused by the next head() (no fresh pages a step)
  uint64_t next_ticket_ = 1;
  size_t peak_ = 0;
  bool rank_mode_ = false;
  std::vector<float> partial_;
};

}  // namespace lily::cpu
