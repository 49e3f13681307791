// The seam between a model split over several ranks (model/shard.h) and the backends that run one rank.
//
// A rank runs the blocks of backend.h over its share of the weights and its own sequence states, with two
// differences: a mixer or FFN block leaves the rank's part of its output in partial() [T, H] instead of
// adding it to the residual stream, and the head writes the logits of the rank's vocabulary rows only
// (columns [vocab0, vocab0 + rows) of a [O, V] buffer). The driver (rank_driver.h) runs a block on every
// rank, sums the parts through a Collective and lets every rank add the sum, so every rank holds the same
// residual stream; after the head it gathers the vocabulary columns, so every rank holds the whole logits
// rows and draws the same ids.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace lily {

// A buffer of `rows` rows of `ld` floats in one rank's memory, of which that rank wrote columns
// [col0, col0 + cols); a gather fills the other ranks' columns in.
struct RankColumns {
  float* data = nullptr;
  int64_t rows = 0, ld = 0, col0 = 0, cols = 0;
};

class RankBackend {
 public:
  virtual ~RankBackend() = default;
  // The rank's blocks: new_state / begin / embed / gdn_mixer / attn_mixer / ffn / head / end / finish and
  // the sampler, over its share and its own states (a step's groups name this rank's states).
  virtual Backend& blocks() = 0;
  // The rank's part of the last mixer / FFN block's output, [T, H] fp32 in the rank's memory (host memory
  // for CPU ranks, its device's for CUDA ranks); the collective sums it in place.
  virtual float* partial() = 0;
  // x += partial() (after the sum).
  virtual void add_partial() = 0;
  // After head(): what the ranks exchange (the logits rows, or the candidates of a distributed argmax);
  // rows == 0: nothing.
  virtual RankColumns head_columns() = 0;
  // After the gather: the head's remaining work (ids drawn from the whole rows).
  virtual void head_finish() = 0;
  // The current step replays a captured graph that holds the blocks and the exchanges (the same on every
  // rank): the driver then runs no exchange and no add_partial / head_finish of its own.
  virtual bool replaying() const { return false; }
};

// The exchanges between ranks, on the ranks' own memory; each call takes one buffer per rank (rank order).
class Collective {
 public:
  virtual ~Collective() = default;
  // bufs[r][0, n) = Σ_q bufs[q][0, n) on every rank.
  virtual void all_reduce(std::span<float* const> bufs, size_t n) = 0;
  // Every rank's RankColumns filled with the columns the others wrote (same rows and ld on every rank).
  virtual void all_gather_columns(std::span<const RankColumns> parts) = 0;
};

// The collective of ranks that share one memory space and run one after another (CPU ranks, tests): the
// sums and copies are plain host loops, in rank order.
class HostCollective final : public Collective {
 public:
  void all_reduce(std::span<float* const> bufs, size_t n) override;
  void all_gather_columns(std::span<const RankColumns> parts) override;
};

}  // namespace lily
