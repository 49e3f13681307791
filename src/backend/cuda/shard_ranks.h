// The model split over CUDA ranks (model/shard.h, backend/rank_driver.h): rank r on GPU devices[r], its
// share of the weights uploaded straight from the checkpoint's mapping (or drawn on its GPU for a
// shapes-only synth model), every layer's mixer and MoE outputs summed over the ranks by one all-reduce
// each, the vocabulary-split head gathered (greedy steps: a distributed argmax). Ranks on distinct GPUs talk
// through NCCL (NVLink multicast off); ranks that all name one GPU run in turn on it (the one-GPU check of
// the split, no graphs).
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace lily {

// Throws InputError before anything is uploaded when a device is absent, a device list mixes repeated and
// distinct GPUs, the model does not divide (naming the config field), or the ranks' bytes do not fit a
// GPU's free memory (bytes needed vs free, per GPU). One device: the plain CUDA backend.
std::unique_ptr<Backend> make_cuda_ranks(std::shared_ptr<const ModelWeights> w, const std::vector<int>& devices,
                                         const CudaOptions& opt = {});

// Rank r's own CUDA backend inside a backend made by make_cuda_ranks (`lily inspect` lists rank 0's
// decode step).
Backend& cuda_rank_backend(Backend& split, int r);

// Device memory a rank needs beyond its weights (activations, logits, state of a few sequences), as the
// fit check counts it.
size_t cuda_rank_working_bytes(const ModelConfig& c);

}  // namespace lily
