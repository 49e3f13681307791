// A model split over N ranks (devices) by tensor and expert parallelism, and each rank's share of the weights.
//
// Every rank runs every layer on its share; the sum over ranks of a block's outputs is the whole model's:
//   attention   query heads split; KV heads split (N | Hkv) or copied within a GQA group (Hkv | N): each
//               rank computes its query heads with their KV head; o_proj's input columns cut by head.
//   DeltaNet    value heads split; key heads split (N | Hk) or copied (Hk | N); conv channels, dt_bias, A,
//               z / b / a rows follow their heads; out_proj's input columns cut by value head.
//   MoE         the router on every rank (the top-k is global); experts in balanced ranges; the shared
//               expert (and a dense MLP) split along its intermediate size, or whole on one rank (round-robin
//               over the layers) where the weight format cannot cut its down projection there.
//   head        lm_head rows split by vocabulary; embedding, norms and the MTP fc on every rank.
// So a rank's share is a smaller model of the same architecture (its cfg has the rank's head counts), whose
// FFN holds a range of the experts (FfnWeights::expert0) and whose lm_head holds a range of the vocabulary
// (ModelWeights::vocab0).
//
// Cuts by format: dense weights are views (row ranges, column ranges through the row stride) except the
// DeltaNet q‖k‖v rows, which are gathered; affine weights cut rows anywhere (views) and columns at group
// boundaries (copied); EXL3 cuts columns at 128-wide Hadamard blocks (views of the trellis), and rows at
// 128-wide blocks of the padded output (tile columns copied), keeping the whole product and selecting its
// outputs where a row cut falls inside a block.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"

namespace lily {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// [0, total) in n consecutive ranges of ceil/floor sizes, in units of `align` (the last range ends at total).
// Throws InternalError when n ranges of at least one unit do not fit.
std::vector<Range> balanced_ranges(int64_t total, int n, int64_t align = 1);

struct RankPlan {
  Range q_heads, kv_heads;  // attention: query heads, KV heads (a copied head: the same one on several ranks)
  Range k_heads, v_heads;   // DeltaNet key heads (split or copied), value heads
  Range experts;            // routed experts
  Range vocab;              // lm_head rows
};

// How one layer's FFN (MoE shared expert, or dense MLP) is cut: split along the intermediate size
// (owner == -1, rank r taking inter[r]), or whole on rank `owner`.
struct FfnCut {
  int owner = -1;
  std::vector<Range> inter;
};

struct ShardPlan {
  int ranks = 1;
  std::vector<RankPlan> rank;
  bool kv_copied = false, k_copied = false;
  std::vector<FfnCut> ffn;  // per layer, then the MTP layer (index cfg.layers) when the model has one

  // The plan for `ranks` ranks; throws InputError naming the config field (or the weight and its format)
  // that does not divide.
  static ShardPlan make(const ModelWeights& w, int ranks);
};

// Rank r's share of w (views into w's storage where the format allows; w stays alive through it).
// shapes_only: sizes and formats without data (nothing copied), as a source without storage gives too.
std::shared_ptr<ModelWeights> rank_share(std::shared_ptr<const ModelWeights> w, const ShardPlan& plan, int r,
                                         bool shapes_only = false);

// Bytes of the matrices of rank r's share (main model and MTP block; replicated ones counted on every rank),
// without copying any: as stored, or (device) with dense weights in bf16 as the CUDA backend holds them.
size_t rank_weight_bytes(const ModelWeights& w, const ShardPlan& plan, int r, bool device = false);

}  // namespace lily
