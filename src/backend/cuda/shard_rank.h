// Internals of the CUDA ranks (not a public header; shard_ranks.h is): the rank-mode state a CudaRank hands
// its CudaBackend (cuda_impl.h: rank_, rank_out_), and the collectives over CUDA ranks.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_impl.h"
#include "backend/rank_backend.h"

namespace lily::cuda {

struct RankExt {
  int rank = 0, ranks = 1;
  float* partial = nullptr;  // [cap_T, H]: the mixers' and the FFN's part (rank_out_)
  int cap_T = 0;
  void* moe = nullptr;       // the rank MoE's scratch (shard_ops.h rank_moe_layout)
  size_t moe_bytes = 0;
  float* cand = nullptr;     // distributed argmax candidates [cand_rows][2 · ranks]
  int cand_rows = 0;
  // what the head of the current step left to gather; argmax: the candidates (else the logits rows)
  RankColumns head;
  bool argmax = false;
};

// Rows per expert tile of a rank's MoE in a step of T rows (the multi-row products' tiles, or the GEMM's).
int rank_moe_tile_rows(int T);

// Makes `device` current for the scope (ranks on several GPUs are driven from one thread).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
};

// The ranks on one device, one after another: sums and copies on the device after waiting for it (no
// graphs: a captured step cannot wait for the other ranks).
class TurnCollective final : public Collective {
 public:
  explicit TurnCollective(int device) : device_(device) {}
  void all_reduce(std::span<float* const> bufs, size_t n) override;
  void all_gather_columns(std::span<const RankColumns> parts) override;

 private:
  int device_;
};

// The ranks on distinct devices through NCCL (shard_nccl.cpp): one communicator per rank, the calls on
// each rank's stream (inside its captured decode graphs too). Throws InputError when NCCL cannot be loaded.
std::unique_ptr<Collective> make_nccl_collective(const std::vector<int>& devices, const std::vector<cudaStream_t>& streams);

}  // namespace lily::cuda
